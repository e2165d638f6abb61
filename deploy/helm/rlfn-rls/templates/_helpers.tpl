{{- define "rlfn-rls.name" -}}
{{- printf "%s-rlfn-rls" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlfn-rls.labels" -}}
app.kubernetes.io/name: rlfn-rls
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "rlfn-rls.tag" . | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{- end -}}

{{- define "rlfn-rls.selector" -}}
app.kubernetes.io/name: rlfn-rls
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rlfn-rls.urlEnv" -}}
- name: RLFN_URL
{{- if .secret.name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret.name }}
      key: {{ .secret.key }}
{{- else }}
  value: {{ required "url or urlSecret.name is required" .url | quote }}
{{- end }}
{{- end -}}

{{- /* The readiness probe's path: readinessPath, else /healthcheck with fallback return_error
(the backend's health decides), else /metrics (the fallback decides). */ -}}
{{- define "rlfn-rls.readinessPath" -}}
{{- if .Values.readinessPath -}}
{{- .Values.readinessPath -}}
{{- else if eq .Values.fallback "return_error" -}}
/healthcheck
{{- else -}}
/metrics
{{- end -}}
{{- end -}}

{{- /* The service's image tag, and the deploy Job's, which follows it: the release the Job
deploys is the one the service embeds. */ -}}
{{- define "rlfn-rls.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}
{{- define "rlfn-rls.jobTag" -}}
{{- .Values.deployJob.image.tag | default (include "rlfn-rls.tag" .) -}}
{{- end -}}
