{{/* Names and labels, as `helm create` names them. */}}
{{- define "kvgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvgate.replicaSecretName" -}}
{{- default (printf "%s-replica-credentials" (include "kvgate.fullname" .)) .Values.replicaCredentials.existingSecret -}}
{{- end -}}

{{- define "kvgate.discoveryNamespace" -}}
{{- default .Release.Namespace .Values.discovery.kubernetes.namespace -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: the drain's two phases plus a margin, from the same values that go
into the config as server.drain_propagation_s and server.drain_timeout_s.
*/}}
{{- define "kvgate.terminationGracePeriodSeconds" -}}
{{- $d := .Values.drain -}}
{{- addf $d.propagationSeconds $d.timeoutSeconds $d.marginSeconds | ceil | int -}}
{{- end -}}

{{/*
The kvgate config file: `.Values.config` with the chart-owned keys set from their values. A
chart-owned key also given under `config:` fails the render, naming the value to use.
*/}}
{{- define "kvgate.config" -}}
{{- $cfg := deepCopy (default (dict) .Values.config) -}}
{{- $server := default (dict) (get $cfg "server") -}}
{{- $owned := dict "host" "listenAddress" "port" "containerPort" "drain_propagation_s" "drain.propagationSeconds" "drain_timeout_s" "drain.timeoutSeconds" -}}
{{- range $key, $value := $owned -}}
{{- if hasKey $server $key -}}
{{- fail (printf "config.server.%s is set by the chart: set %s instead" $key $value) -}}
{{- end -}}
{{- end -}}
{{- $d := .Values.drain -}}
{{- if or (lt (float64 $d.propagationSeconds) 0.0) (le (float64 $d.timeoutSeconds) 0.0) (lt (float64 $d.marginSeconds) 0.0) -}}
{{- fail "drain: propagationSeconds and marginSeconds must be >= 0, timeoutSeconds > 0" -}}
{{- end -}}
{{- $r := .Values.probes.readiness -}}
{{- if gt (mul (int $r.periodSeconds) (int $r.failureThreshold)) (int (floor (float64 $d.propagationSeconds))) -}}
{{- fail (printf "probes.readiness: periodSeconds x failureThreshold (%d s) must fit in drain.propagationSeconds (%v s): kvgate refuses new requests after the propagation window" (mul (int $r.periodSeconds) (int $r.failureThreshold)) $d.propagationSeconds) -}}
{{- end -}}
{{- $_ := set $server "host" .Values.listenAddress -}}
{{- $_ := set $server "port" (int .Values.containerPort) -}}
{{- $_ := set $server "drain_propagation_s" $d.propagationSeconds -}}
{{- $_ := set $server "drain_timeout_s" $d.timeoutSeconds -}}
{{- $_ := set $cfg "server" $server -}}
{{- $state := default (dict) (get $cfg "state") -}}
{{- if .Values.redis.url -}}
{{- if hasKey $state "store" -}}
{{- fail "config.state.store is set by the chart when redis.url is given: set only one of them" -}}
{{- end -}}
{{- if not (or (hasPrefix "redis://" .Values.redis.url) (hasPrefix "rediss://" .Values.redis.url)) -}}
{{- fail "redis.url must be a redis:// or rediss:// URL" -}}
{{- end -}}
{{- $_ := set $state "store" .Values.redis.url -}}
{{- end -}}
{{- if not (hasKey $state "gateways") -}}
{{- $_ := set $state "gateways" (int .Values.replicaCount) -}}
{{- end -}}
{{- $_ := set $cfg "state" $state -}}
{{- $disc := default (dict) (get $cfg "discovery") -}}
{{- $k := .Values.discovery.kubernetes -}}
{{- $kc := default (dict) (get $disc "kubernetes") -}}
{{- if and $kc (not $k.enabled) -}}
{{- fail "config.discovery.kubernetes is given but discovery.kubernetes.enabled is false: enable it (the chart sets the source and its RBAC from discovery.kubernetes)" -}}
{{- end -}}
{{- if $k.enabled -}}
{{- range $key := list "namespace" "service" "selector" "port" "model" -}}
{{- if hasKey $kc $key -}}
{{- fail (printf "config.discovery.kubernetes.%s is set by the chart: set discovery.kubernetes.%s instead (the RBAC is derived from it)" $key $key) -}}
{{- end -}}
{{- end -}}
{{- if eq (empty $k.service) (empty $k.selector) -}}
{{- fail "discovery.kubernetes: set exactly one of service and selector" -}}
{{- end -}}
{{- $_ := set $kc "namespace" (include "kvgate.discoveryNamespace" .) -}}
{{- $_ := set $kc "port" (int $k.port) -}}
{{- if $k.service -}}{{- $_ := set $kc "service" $k.service -}}{{- end -}}
{{- if $k.selector -}}{{- $_ := set $kc "selector" $k.selector -}}{{- end -}}
{{- if $k.model -}}{{- $_ := set $kc "model" $k.model -}}{{- end -}}
{{- $_ := set $disc "kubernetes" $kc -}}
{{- end -}}
{{- if $disc -}}
{{- $_ := set $cfg "discovery" $disc -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}
