{{- define "gpuheal.labels" -}}
app.kubernetes.io/name: gpuheal
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "gpuheal.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{- define "gpuheal.tlsVolume" -}}
{{- if .Values.temporal.tls.secretName }}
- name: temporal-tls
  secret: {secretName: {{ .Values.temporal.tls.secretName | quote }}}
{{- end }}
{{- end }}

{{- define "gpuheal.tlsMount" -}}
{{- if .Values.temporal.tls.secretName }}
- {name: temporal-tls, mountPath: /etc/temporal-tls, readOnly: true}
{{- end }}
{{- end }}

{{- define "gpuheal.policyVolume" -}}
- name: policy
  configMap: {name: {{ .Release.Name }}-policy}
{{- end }}

{{- define "gpuheal.policyMount" -}}
- {name: policy, mountPath: /etc/gpuheal, readOnly: true}
{{- end }}
