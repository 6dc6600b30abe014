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

{{/* shards.count, checked: 1..64 (gpuhealth.protocol.shards.MAX_SHARDS). */}}
{{- define "gpuhealth.shardCount" -}}
{{- $n := int .Values.shards.count -}}
{{- if or (lt $n 1) (gt $n 64) }}{{ fail (printf "shards.count must be 1..64 (got %v)" .Values.shards.count) }}{{ end -}}
{{- if and (gt $n 1) (or (lt (int .Values.controller.replicas) 1) (gt (int .Values.controller.replicas) 65)) }}{{ fail (printf "controller.replicas must be 1..65 with shards (got %v); count + 1 leaves a spare" .Values.controller.replicas) }}{{ end -}}
{{- $n -}}
{{- end -}}

{{/* Shard i's name beside a name of one shard ("<name>-shard-<i>": its Lease, Service,
     breaker ConfigMap), for every shard; empty with one shard. JSON list. */}}
{{- define "gpuhealth.shardNames" -}}
{{- $names := list -}}
{{- $n := int (include "gpuhealth.shardCount" .root) -}}
{{- if gt $n 1 }}{{ range $i := until $n }}{{ $names = append $names (printf "%s-shard-%d" $.name $i) }}{{ end }}{{ end -}}
{{- toJson $names -}}
{{- end -}}

{{/* The ConfigMap the singleton keeps the shards' node counts in (shards.sizes_configmap). */}}
{{- define "gpuhealth.shardSizesConfigMap" -}}
{{- dig "shards" "sizes_configmap" "gpuhealth-shards" (deepCopy .Values.controller.config) -}}
{{- end -}}

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

{{/* The controller Service's DNS name: where agents connect, and the name its certificate
     is verified against. */}}
{{- define "gpuhealth.controller.host" -}}
{{- printf "%s.%s.svc" (include "gpuhealth.controller.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The per-shard Services' names and DNS names (empty with one shard): JSON list. */}}
{{- define "gpuhealth.controller.shardHostNames" -}}
{{- $out := list -}}
{{- range (include "gpuhealth.shardNames" (dict "root" . "name" (include "gpuhealth.controller.fullname" .)) | fromJsonArray) -}}
{{- $host := printf "%s.%s.svc" . $.Release.Namespace -}}
{{- $out = concat $out (list . (printf "%s.%s" . $.Release.Namespace) $host (printf "%s.cluster.local" $host)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The Secret the controller serves TLS with: the user's, or the one the chart generates
     or cert-manager writes. */}}
{{- define "gpuhealth.controller.tlsSecret" -}}
{{- default (printf "%s-tls" (include "gpuhealth.controller.fullname" .)) .Values.controller.tls.secretName -}}
{{- end -}}

{{/* "secret" (the user's), "cert-manager", "generate" (a CA the chart generates, kept with
     Helm's lookup) or "controller" (a CA the controller creates once and keeps:
     controller.tls.generatedBy=controller, the mode that survives helm template). */}}
{{- define "gpuhealth.controller.tlsSource" -}}
{{- $t := .Values.controller.tls -}}
{{- if and $t.secretName $t.certManager.enabled -}}
{{- fail "controller.tls: set secretName (your own certificate) or certManager.enabled, not both" -}}
{{- end -}}
{{- if not (has $t.generatedBy (list "chart" "controller")) -}}
{{- fail (printf "controller.tls.generatedBy must be chart or controller, not %q" $t.generatedBy) -}}
{{- end -}}
{{- if $t.secretName }}secret{{ else if $t.certManager.enabled }}cert-manager{{ else if eq $t.generatedBy "controller" }}controller{{ else }}generate{{ end -}}
{{- end -}}

{{/* The Secret the controller keeps its own certificate in (controller.tls.generatedBy=
     controller): not the chart's, so that Helm never renders, replaces or deletes it. */}}
{{- define "gpuhealth.controller.keptSecret" -}}
{{- printf "%s-certificate" (include "gpuhealth.controller.fullname" .) -}}
{{- end -}}

{{/* The ConfigMap the agents take the controller's CA from (the CA alone, never a Secret
     with a key): the user's trust bundle (controller.tls.caConfigMap), else
     <fullname>-controller-ca, which the chart renders for its generated CA and the
     controller publishes for every other source. */}}
{{- define "gpuhealth.controller.caConfigMap" -}}
{{- default (printf "%s-ca" (include "gpuhealth.controller.fullname" .)) .Values.controller.tls.caConfigMap -}}
{{- end -}}

{{/* Does the controller publish the CA ConfigMap itself? */}}
{{- define "gpuhealth.controller.publishesCA" -}}
{{- if and .Values.controller.tls.enabled (not .Values.controller.tls.caConfigMap) (ne (include "gpuhealth.controller.tlsSource" .) "generate") }}true{{ end -}}
{{- end -}}

{{/* The certificate's DNS names: the Service's, and localhost for a port-forward. */}}
{{- define "gpuhealth.controller.tlsNames" -}}
{{- $svc := include "gpuhealth.controller.fullname" . -}}
{{- $host := include "gpuhealth.controller.host" . -}}
{{- $shards := include "gpuhealth.controller.shardHostNames" . | fromJsonArray -}}
{{- toJson (concat (list $host $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.cluster.local" $host) "localhost") $shards) -}}
{{- end -}}

{{/* The controller's tls: section: what it keeps or publishes itself. */}}
{{- define "gpuhealth.controller.tlsConfig" -}}
{{- $out := dict -}}
{{- if .Values.controller.tls.enabled -}}
{{- $source := include "gpuhealth.controller.tlsSource" . -}}
{{- if eq $source "controller" -}}
{{- $_ := set $out "secret" (include "gpuhealth.controller.keptSecret" .) -}}
{{- $_ := set $out "names" (include "gpuhealth.controller.tlsNames" . | fromJsonArray) -}}
{{- else if include "gpuhealth.controller.publishesCA" . -}}
{{- $_ := set $out "ca_file" "/etc/gpuhealth/tls/ca.crt" -}}
{{- end -}}
{{- if include "gpuhealth.controller.publishesCA" . -}}
{{- $_ := set $out "ca_configmap" (include "gpuhealth.controller.caConfigMap" .) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The generated CA and serving certificate (base64, as Secret data): read back from the
     release's Secret when it holds all three keys (so an upgrade keeps them), otherwise
     generated. Made once per render and shared by every template (the Secret, the CA
     ConfigMap, the pods' checksums). `helm template` cannot look up: it always generates. */}}
{{- define "gpuhealth.controller.tlsMaterial" -}}
{{- $t := .Values.controller.tls -}}
{{- if not (hasKey $t "_material") -}}
{{- $found := lookup "v1" "Secret" .Release.Namespace (include "gpuhealth.controller.tlsSecret" .) -}}
{{- $data := (get (default dict $found) "data") | default dict -}}
{{- $shards := include "gpuhealth.controller.shardHostNames" . | fromJsonArray -}}
{{- $for := dig "metadata" "annotations" "gpuhealth.io/tls-shards" "1" (default dict $found) -}}
{{- /* A certificate made for other shards' Services lacks their names: a new one. */ -}}
{{- if and (get $data "ca.crt") (get $data "tls.crt") (get $data "tls.key") (or (not $shards) (eq $for (include "gpuhealth.shardCount" .))) -}}
{{- $_ := set $t "_material" (dict "ca.crt" (get $data "ca.crt") "tls.crt" (get $data "tls.crt") "tls.key" (get $data "tls.key")) -}}
{{- else -}}
{{- $days := int $t.generatedValidityDays -}}
{{- $ca := genCA (printf "%s-ca" (include "gpuhealth.controller.fullname" .)) $days -}}
{{- $svc := include "gpuhealth.controller.fullname" . -}}
{{- $host := include "gpuhealth.controller.host" . -}}
{{- $names := list $svc (printf "%s.%s" $svc .Release.Namespace) $host (printf "%s.cluster.local" $host) -}}
{{- /* localhost too: an operator's `kubectl port-forward` to the leader verifies it. */ -}}
{{- $cert := genSignedCert $host nil (concat (append $names "localhost") $shards) $days $ca -}}
{{- $_ := set $t "_material" (dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- toYaml (get $t "_material") -}}
{{- end -}}

{{/* Pod annotation that changes when the controller's generated certificate does, so a
     rotation restarts the controller and the agents; empty for the other sources (the
     controller reloads a renewed certificate itself). */}}
{{- define "gpuhealth.controller.tlsChecksum" -}}
{{- if and .Values.controller.tls.enabled (eq (include "gpuhealth.controller.tlsSource" .) "generate") -}}
{{- $m := include "gpuhealth.controller.tlsMaterial" . | fromYaml -}}
checksum/tls: {{ printf "%s %s" (get $m "ca.crt") (get $m "tls.crt") | sha256sum }}
{{- end -}}
{{- end -}}

{{/* Where agents reach the controller's stream. */}}
{{- define "gpuhealth.controllerURL" -}}
{{- $scheme := ternary "wss" "ws" .Values.controller.tls.enabled -}}
{{- $host := include "gpuhealth.controller.host" . -}}
{{- if gt (int (include "gpuhealth.shardCount" .)) 1 -}}
{{- /* Each agent formats {shard} itself: its node's shard (gpuhealth.protocol.shards). */ -}}
{{- $host = printf "%s-shard-{shard}.%s.svc" (include "gpuhealth.controller.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- printf "%s://%s:%d/v1/stream" $scheme $host (int .Values.controller.port) -}}
{{- end -}}

{{/* The controller's config: user values over what this release fixes (key prefix,
     the leader Lease, the breaker's ConfigMap, and which ServiceAccount and token audience
     agents present). */}}
{{- define "gpuhealth.controller.config" -}}
{{- $leader := dict "namespace" .Release.Namespace "lease_name" (include "gpuhealth.leaseName" .) "service" (include "gpuhealth.controller.fullname" .) -}}
{{- $stream := dict "audience" .Values.agent.token.audience "agent_namespace" .Release.Namespace "agent_service_account" (include "gpuhealth.agent.serviceAccountName" .) -}}
{{- $breaker := dict "configmap" (include "gpuhealth.breakerConfigMap" .) -}}
{{- $grace := int .Values.controller.terminationGracePeriodSeconds -}}
{{- if lt $grace 10 }}{{ fail "controller.terminationGracePeriodSeconds must be at least 10 (the controller stops within it minus 5 s)" }}{{ end -}}
{{- if gt (len .Values.keyPrefix) 51 }}{{ fail (printf "keyPrefix must be at most 51 characters (got %d): the operator's override labels node-restriction.kubernetes.io/<keyPrefix>-exclude and -remediation must have a name part of at most 63" (len .Values.keyPrefix)) }}{{ end -}}
{{- $base := dict "prefix" .Values.keyPrefix "leader" $leader "stream" $stream "breaker" $breaker "shutdown_deadline_s" (sub $grace 5) -}}
{{- $tls := include "gpuhealth.controller.tlsConfig" . | fromJson -}}
{{- if $tls }}{{ $_ := set $base "tls" $tls }}{{ end -}}
{{- if .Values.controller.extenderClientCA -}}
{{- if not .Values.controller.tls.enabled }}{{ fail "controller.extenderClientCA needs controller.tls.enabled" }}{{ end -}}
{{- $_ := set $base "extender" (dict "client_ca_file" "/etc/gpuhealth/extender-client-ca/ca.crt") -}}
{{- end -}}
{{- if .Values.controller.idle.annotatePods }}{{ $_ := set $base "idle" (dict "annotate" true) }}{{ end -}}
{{- $shards := int (include "gpuhealth.shardCount" .) -}}
{{- if and (gt $shards 1) (le (float64 .Values.shards.takeoverAfterSeconds) 0.0) }}{{ fail (printf "shards.takeoverAfterSeconds must be above 0 (got %v)" .Values.shards.takeoverAfterSeconds) }}{{ end -}}
{{- if gt $shards 1 }}{{ $_ := set $base "shards" (dict "count" $shards "replicas" (int .Values.controller.replicas) "takeover_after_s" (float64 .Values.shards.takeoverAfterSeconds)) }}{{ end -}}
{{- /* The other replicas are asked over TLS, verified with the CA agents trust. */ -}}
{{- if and (gt $shards 1) .Values.controller.tls.enabled }}{{ $_ := set $base.shards "peer_ca_file" "/etc/gpuhealth/peer-ca/ca.crt" }}{{ end -}}
{{- $r := .Values.remediation -}}
{{- if $r.enabled }}{{ $_ := set $base "remediation" (dict "enabled" true "dry_run" $r.dryRun "reset_gpu" (dict "enabled" $r.resetGpu) "reboot" (dict "enabled" $r.reboot "approval_required" $r.rebootApproval) "escalate" (dict "enabled" $r.escalate)) }}{{ end -}}
{{- if and $r.enabled $r.replacePools }}{{ $_ := set $base.remediation "replace" (dict "enabled" true "pools" (include "gpuhealth.replacePools" . | fromYamlArray)) }}{{ end -}}
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

{{/* The controller's requests and limits: controller.resources when set, else the row of the
     README's sizing table that fits controller.fleetSize (bench fleet_scale measurements). */}}
{{- define "gpuhealth.controller.resources" -}}
{{- $c := .Values.controller -}}
{{- if $c.resources -}}
{{ toYaml $c.resources }}
{{- else -}}
{{- $n := int $c.fleetSize -}}
{{- $row := dict "cpu" "100m" "memory" "256Mi" "cpuLimit" "1" "memoryLimit" "512Mi" -}}
{{- if gt $n 10000 -}}
{{- $row = dict "cpu" "1" "memory" "1536Mi" "cpuLimit" "2" "memoryLimit" "3Gi" -}}
{{- else if gt $n 5000 -}}
{{- $row = dict "cpu" "500m" "memory" "1Gi" "cpuLimit" "2" "memoryLimit" "2Gi" -}}
{{- else if gt $n 1000 -}}
{{- $row = dict "cpu" "250m" "memory" "512Mi" "cpuLimit" "2" "memoryLimit" "1Gi" -}}
{{- end -}}
requests:
  cpu: {{ $row.cpu | quote }}
  memory: {{ $row.memory }}
limits:
  cpu: {{ $row.cpuLimit | quote }}
  memory: {{ $row.memoryLimit }}
{{- end -}}
{{- end -}}

{{/* remediation.replacePools, each with its method (nodeclaim when left out). */}}
{{- define "gpuhealth.replacePools" -}}
{{- $pools := list -}}
{{- range .Values.remediation.replacePools -}}
{{- if not .pool }}{{ fail "remediation.replacePools: every entry needs a pool" }}{{ end -}}
{{- $method := default "nodeclaim" .method -}}
{{- if not (has $method (list "nodeclaim" "node")) }}{{ fail (printf "remediation.replacePools: pool %s: method must be nodeclaim or node (got %s)" .pool $method) }}{{ end -}}
{{- $pools = append $pools (dict "pool" .pool "method" $method) -}}
{{- end -}}
{{- toYaml $pools -}}
{{- end -}}

{{/* The replacement methods remediation.replacePools uses (its RBAC follows them). */}}
{{- define "gpuhealth.replaceMethods" -}}
{{- $methods := list -}}
{{- range (include "gpuhealth.replacePools" . | fromYamlArray) }}{{ $methods = append $methods .method }}{{ end -}}
{{- $methods | uniq | join "," -}}
{{- end -}}
