{{/* Names and labels. */}}
{{- define "banditstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "banditstream.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "banditstream.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "banditstream.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: banditstream
{{- end }}

{{- define "banditstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "banditstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component (join, learn, publish): call with (dict "root" $ "component" "join"). */}}
{{- define "banditstream.componentLabels" -}}
{{ include "banditstream.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "banditstream.componentSelector" -}}
{{ include "banditstream.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "banditstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "banditstream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "banditstream.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Where the pod mounts things; the rendered config points at the same places. */}}
{{- define "banditstream.configPath" -}}/etc/banditstream/banditstream.yaml{{- end }}
{{- define "banditstream.stateDir" -}}/var/lib/banditstream{{- end }}
{{- define "banditstream.keysDir" -}}/etc/banditstream/keys{{- end }}
{{- define "banditstream.cacheDir" -}}/var/cache/banditstream{{- end }}
{{- define "banditstream.serveKeysDir" -}}/etc/banditstream/serve-keys{{- end }}

{{/*
The banditstream config: the user's tree with the fields the chart owns (paths of its mounts,
the metrics and serve addresses its probes, containerPorts and Services use) overwritten.
*/}}
{{- define "banditstream.config" -}}
{{- $owned := dict
  "stores" (dict "state_dir" (include "banditstream.stateDir" .))
  "sdk" (dict "cache_dir" (include "banditstream.cacheDir" .))
  "publish" (dict "keys_dir" (include "banditstream.keysDir" .))
  "metrics" (dict "port" (int .Values.metrics.port) "host" "0.0.0.0") }}
{{- if .Values.serve.enabled }}
{{- $_ := set $owned "serve" (dict "host" "0.0.0.0" "port" (int .Values.serve.port) "key_dir" (include "banditstream.serveKeysDir" .)) }}
{{- end }}
{{- $config := mustMergeOverwrite (deepCopy .Values.config) $owned }}
{{- toYaml $config }}
{{- end }}

{{/* Pod-level pieces shared by the three workers: call with (dict "root" $ "component" "join"). */}}
{{- define "banditstream.env" -}}
- name: BANDITSTREAM_CONFIG
  value: {{ include "banditstream.configPath" .root }}
- name: HOME
  value: /tmp
{{- with .root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "banditstream.probeCommand" -}}
exec:
  command:
    - python
    - -c
    - "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{{ .Values.metrics.port }}/metrics', timeout=4)"
{{- end }}

{{- define "banditstream.workerContainer" -}}
{{- $root := .root -}}
- name: {{ .component }}
  image: {{ include "banditstream.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args: [{{ .component | quote }}]
  env:
    {{- include "banditstream.env" . | nindent 4 }}
    {{- with .extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $root.Values.extraEnvFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: metrics
      containerPort: {{ $root.Values.metrics.port }}
  startupProbe:
    {{- include "banditstream.probeCommand" $root | nindent 4 }}
    {{- toYaml $root.Values.probes.startup | nindent 4 }}
  livenessProbe:
    {{- include "banditstream.probeCommand" $root | nindent 4 }}
    {{- toYaml $root.Values.probes.liveness | nindent 4 }}
  resources:
    {{- toYaml .resources | nindent 4 }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: config
      mountPath: {{ include "banditstream.configPath" $root }}
      subPath: banditstream.yaml
      readOnly: true
    - name: state
      mountPath: {{ include "banditstream.stateDir" $root }}
    - name: tmp
      mountPath: /tmp
    {{- with .extraMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{- define "banditstream.topicsInitContainer" -}}
{{- if .Values.topics.create -}}
initContainers:
  - name: topics
    image: {{ include "banditstream.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    args: ["topics", "create"]
    env:
      {{- include "banditstream.env" (dict "root" .) | nindent 6 }}
    {{- with .Values.extraEnvFrom }}
    envFrom:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    resources:
      requests: {cpu: 50m, memory: 128Mi}
      limits: {cpu: 500m, memory: 256Mi}
    securityContext:
      {{- toYaml .Values.securityContext | nindent 6 }}
    volumeMounts:
      - name: config
        mountPath: {{ include "banditstream.configPath" . }}
        subPath: banditstream.yaml
        readOnly: true
      - name: tmp
        mountPath: /tmp
{{- end }}
{{- end }}

{{- define "banditstream.podCommon" -}}
{{- $root := .root -}}
{{- $values := index $root.Values .component -}}
serviceAccountName: {{ include "banditstream.serviceAccountName" $root }}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ $values.terminationGracePeriodSeconds }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "banditstream.podMetadata" -}}
labels:
  {{- include "banditstream.componentLabels" . | nindent 2 }}
  {{- with .root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ include "banditstream.config" .root | sha256sum }}
  {{- with .root.Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* The learner's shutdown must fit in its grace period (flush_timeout_s plus the rest of the shutdown). */}}
{{- define "banditstream.checkGrace" -}}
{{- $flush := 30 }}
{{- with .Values.config.learn }}{{ with .flush_timeout_s }}{{ $flush = . }}{{ end }}{{ end }}
{{- if lt (float64 .Values.learn.terminationGracePeriodSeconds) (addf $flush 15) }}
{{- fail (printf "learn.terminationGracePeriodSeconds (%v) must be at least config.learn.flush_timeout_s + 15 (%v): the learner flushes its producer for up to flush_timeout_s on SIGTERM" .Values.learn.terminationGracePeriodSeconds (addf $flush 15)) }}
{{- end }}
{{- end }}

{{/* What the serve pods cannot do: keys in the ConfigMap, or a model reset without the publish keys. */}}
{{- define "banditstream.checkServe" -}}
{{- $serve := (.Values.config.serve | default dict) }}
{{- if $serve.keys }}
{{- fail "config.serve.keys: subscription keys are secrets and the config is a ConfigMap; put them in the Secret named by serve.keys.existingSecret (one file per key)" }}
{{- end }}
{{- if and .Values.serve.enabled $serve.allow_model_reset }}
{{- fail "config.serve.allow_model_reset: the serve pods mount only root.json of the signing keys, not the private keys a model reset signs with" }}
{{- end }}
{{- if and .Values.serve.enabled .Values.serve.autoscaling.enabled }}
{{- if gt (int .Values.serve.autoscaling.minReplicas) (int .Values.serve.autoscaling.maxReplicas) }}
{{- fail (printf "serve.autoscaling.minReplicas (%v) is more than maxReplicas (%v)" .Values.serve.autoscaling.minReplicas .Values.serve.autoscaling.maxReplicas) }}
{{- end }}
{{- $_ := required "serve.resources.requests.cpu: the HorizontalPodAutoscaler's CPU utilisation is relative to it" (.Values.serve.resources.requests | default dict).cpu }}
{{- end }}
{{- end }}
