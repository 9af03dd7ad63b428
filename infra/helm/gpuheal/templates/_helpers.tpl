{{- define "gpuheal.labels" -}}
app.kubernetes.io/name: gpuheal
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "gpuheal.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{- /* The component's own Temporal client certificate (worker or webhook): its Secret's name. */}}
{{- define "gpuheal.tlsSecret" -}}
{{- if eq .component "webhook" }}{{ .root.Values.temporal.tls.webhookSecretName }}{{ else }}{{ .root.Values.temporal.tls.secretName }}{{ end }}
{{- end }}

{{- define "gpuheal.tlsVolume" -}}
{{- $secret := include "gpuheal.tlsSecret" . }}
{{- if $secret }}
- name: temporal-tls
  secret: {secretName: {{ $secret | quote }}, defaultMode: 0440}  # the pod's fsGroup reads it
{{- end }}
{{- end }}

{{- define "gpuheal.tlsMount" -}}
{{- if include "gpuheal.tlsSecret" . }}
- {name: temporal-tls, mountPath: /etc/temporal-tls, readOnly: true}
{{- end }}
{{- end }}

{{- /* Secrets reach a pod only from Secrets: the API key (both components: Temporal), the Slurm
JWT (a file), extraSecretEnv (the worker's only: the webhook gets nothing it does not use). */}}
{{- define "gpuheal.apiKeyEnv" -}}
{{- if .Values.temporal.apiKeySecret.name }}
- name: GPUHEAL_TEMPORAL_API_KEY
  valueFrom: {secretKeyRef: {name: {{ .Values.temporal.apiKeySecret.name | quote }}, key: {{ .Values.temporal.apiKeySecret.key | quote }}}}
{{- end }}
{{- end }}

{{- define "gpuheal.secretEnv" -}}
{{- include "gpuheal.apiKeyEnv" . }}
{{- range $name, $ref := .Values.extraSecretEnv }}
- name: {{ $name }}
  valueFrom: {secretKeyRef: {name: {{ required (printf "extraSecretEnv.%s.name" $name) $ref.name | quote }}, key: {{ required (printf "extraSecretEnv.%s.key" $name) $ref.key | quote }}}}
{{- end }}
{{- end }}

{{- /* What the chart refuses to render: security off by omission, a secret in a ConfigMap. */}}
{{- define "gpuheal.checks" -}}
{{- $t := .Values.temporal }}
{{- if not (or $t.tls.secretName $t.apiKeySecret.name $t.tls.plaintext) }}
{{- fail "temporal: set temporal.tls.secretName (mTLS) or temporal.apiKeySecret.name, or temporal.tls.plaintext=true if plain text is meant: whoever reaches Temporal can approve or abort incidents" }}
{{- end }}
{{- if and $t.tls.secretName .Values.webhook.enabled (not $t.tls.webhookSecretName) }}
{{- fail "temporal.tls.webhookSecretName: the webhook needs a certificate of its own (one identity per component; it only starts incidents)" }}
{{- end }}
{{- if and $t.tls.secretName (eq $t.tls.secretName $t.tls.webhookSecretName) }}
{{- fail "temporal.tls.webhookSecretName must differ from temporal.tls.secretName: one identity per component" }}
{{- end }}
{{- range $name, $_ := .Values.extraEnv }}
{{- if and (regexMatch "(?i)(TOKEN|PASSWORD|API_KEY|SECRET|NOTIFY_URL|OWNER_ROUTES)" $name) (not (hasSuffix "_FILE" $name)) }}
{{- fail (printf "extraEnv.%s looks like a secret and would land in a ConfigMap: give it in extraSecretEnv (from a Secret)" $name) }}
{{- end }}
{{- end }}
{{- $s := .Values.slurm }}
{{- if and (eq $s.backend "cli") (not $s.mungeKeySecret) }}
{{- fail "slurm.mungeKeySecret: the cli backend's Slurm commands need munge with the cluster's key (a Secret with munge.key), or set slurm.backend=rest" }}
{{- end }}
{{- if and (eq $s.backend "rest") (not (and $s.restUrl $s.restTokenSecret.name)) }}
{{- fail "slurm.backend=rest needs slurm.restUrl and slurm.restTokenSecret.name (the JWT, mounted as a file)" }}
{{- end }}
{{- end }}

{{- define "gpuheal.policyVolume" -}}
- name: policy
  configMap: {name: {{ .Release.Name }}-policy}
{{- end }}

{{- define "gpuheal.policyMount" -}}
- {name: policy, mountPath: /etc/gpuheal, readOnly: true}
{{- end }}
