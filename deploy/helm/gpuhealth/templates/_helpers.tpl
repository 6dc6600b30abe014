{{/* Chart name, overridable. */}}
{{- define "gpuhealth.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name prefix of every object: the release name if it already says gpuhealth. */}}
{{- define "gpuhealth.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuhealth.agent.fullname" -}}{{ include "gpuhealth.fullname" . }}-agent{{- end -}}
{{- define "gpuhealth.controller.fullname" -}}{{ include "gpuhealth.fullname" . }}-controller{{- end -}}

{{- define "gpuhealth.agent.serviceAccountName" -}}
{{- default (include "gpuhealth.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- define "gpuhealth.controller.serviceAccountName" -}}
{{- default (include "gpuhealth.controller.fullname" .) .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- define "gpuhealth.leaseName" -}}
{{- default (include "gpuhealth.controller.fullname" .) .Values.controller.leaderElection.leaseName -}}
{{- end -}}

{{- define "gpuhealth.breakerConfigMap" -}}{{ include "gpuhealth.fullname" . }}-breaker{{- end -}}

{{- define "gpuhealth.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "gpuhealth.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpuhealth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpuhealth.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuhealth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuhealth.agent.selectorLabels" -}}
{{ include "gpuhealth.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end -}}
{{- define "gpuhealth.controller.selectorLabels" -}}
{{ include "gpuhealth.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* Where agents reach the controller's stream. */}}
{{- define "gpuhealth.controllerURL" -}}
{{- $scheme := ternary "wss" "ws" .Values.controller.tls.enabled -}}
{{- printf "%s://%s.%s.svc:%d/v1/stream" $scheme (include "gpuhealth.controller.fullname" .) .Release.Namespace (int .Values.controller.port) -}}
{{- end -}}

{{/* The controller's config: user values over what this release fixes (key prefix,
     the leader Lease, the breaker's ConfigMap, and which ServiceAccount and token audience
     agents present). */}}
{{- define "gpuhealth.controller.config" -}}
{{- $leader := dict "namespace" .Release.Namespace "lease_name" (include "gpuhealth.leaseName" .) "service" (include "gpuhealth.controller.fullname" .) -}}
{{- $stream := dict "audience" .Values.agent.token.audience "agent_namespace" .Release.Namespace "agent_service_account" (include "gpuhealth.agent.serviceAccountName" .) -}}
{{- $breaker := dict "configmap" (include "gpuhealth.breakerConfigMap" .) -}}
{{- $base := dict "prefix" .Values.keyPrefix "leader" $leader "stream" $stream "breaker" $breaker -}}
{{- if .Values.controller.idle.annotatePods }}{{ $_ := set $base "idle" (dict "annotate" true) }}{{ end -}}
{{- $r := .Values.remediation -}}
{{- if $r.enabled }}{{ $_ := set $base "remediation" (dict "enabled" true "dry_run" $r.dryRun "reset_gpu" (dict "enabled" $r.resetGpu) "reboot" (dict "enabled" $r.reboot "approval_required" $r.rebootApproval) "escalate" (dict "enabled" $r.escalate)) }}{{ end -}}
{{- toYaml (mustMergeOverwrite $base (deepCopy .Values.controller.config)) -}}
{{- end -}}

{{/* The agent's config: agent.config, and with remediation.enabled its remediation section
     (orders accepted; executors from remediation.agent). Empty: no ConfigMap. */}}
{{- define "gpuhealth.agent.config" -}}
{{- $base := dict -}}
{{- if .Values.remediation.enabled }}{{ $_ := set $base "remediation" (mustMergeOverwrite (dict "enabled" true) (deepCopy .Values.remediation.agent)) }}{{ end -}}
{{- $cfg := mustMergeOverwrite $base (deepCopy .Values.agent.config) -}}
{{- if $cfg }}{{ toYaml $cfg }}{{ end -}}
{{- end -}}
