{{/* Names and labels: one place, one-line helpers. */}}
{{- define "taskshard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "taskshard.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "taskshard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
taskshard.io/component: operator
{{- end -}}

{{- define "taskshard.serviceAccountName" -}}
{{- default (include "taskshard.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "taskshard.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{/* "true" when the operator watches every namespace (clusterWide: true, an explicit opt-in); else empty. */}}
{{- define "taskshard.clusterWide" -}}
{{- if .Values.clusterWide -}}true{{- end -}}
{{- end -}}

{{/* The namespaces the operator watches when not cluster-wide, as a JSON list (read it with fromJsonArray):
     watchNamespaces, or the release namespace when that is empty. Cluster-wide, the release namespace alone
     (where the shard ServiceAccount goes). */}}
{{- define "taskshard.watchNamespaces" -}}
{{- .Values.watchNamespaces | default (list .Release.Namespace) | toJson -}}
{{- end -}}
