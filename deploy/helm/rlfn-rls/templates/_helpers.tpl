{{- /* The objects' name, RELEASE-rlfn-rls: a DNS-1035 label (the Service's name is one), so a
release name that starts with a digit or holds a dot is refused here, not by the API server. */ -}}
{{- define "rlfn-rls.name" -}}
{{- $name := printf "%s-rlfn-rls" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "release name %q: the objects' name %s must start with a letter and hold only a-z, 0-9 and -" .Release.Name $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- /* The deploy Job's name, RELEASE-rlfn-rls-deploy cut to 63 characters (its pods' job-name
label holds it). */ -}}
{{- define "rlfn-rls.jobName" -}}
{{- printf "%s-deploy" (include "rlfn-rls.name" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{- define "rlfn-rls.labels" -}}
app.kubernetes.io/name: rlfn-rls
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ include "rlfn-rls.tag" . | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{- end -}}

{{- define "rlfn-rls.selector" -}}
app.kubernetes.io/name: rlfn-rls
app.kubernetes.io/instance: {{ .Release.Name | quote }}
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
(the backend's health decides), else /ready (a configuration is loaded: the fallback decides
while the backend is gone, but a replica waiting for its first configuration over xDS stays
out). */ -}}
{{- define "rlfn-rls.readinessPath" -}}
{{- if .Values.readinessPath -}}
{{- .Values.readinessPath -}}
{{- else if eq .Values.fallback "return_error" -}}
/healthcheck
{{- else -}}
/ready
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

{{- /* The service's ServiceAccount: the one created (name, default the release's), or an
existing one by name, or "" (the namespace's default). */ -}}
{{- define "rlfn-rls.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "rlfn-rls.name" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* A pod's account: .name when set; never a token (rlfn-rls and rlfn read no Kubernetes
API). */ -}}
{{- define "rlfn-rls.serviceAccount" -}}
{{- with .name }}
serviceAccountName: {{ . }}
{{- end }}
automountServiceAccountToken: false
{{- end -}}

{{- /* What both pods take of the scheduling values. */ -}}
{{- define "rlfn-rls.podScheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
