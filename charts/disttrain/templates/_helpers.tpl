{{/* Names and labels shared by every template. */}}

{{- define "disttrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name; a release already named after the chart is not doubled. */}}
{{- define "disttrain.fullname" -}}
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

{{- define "disttrain.operatorName" -}}
{{- printf "%s-operator" (include "disttrain.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "disttrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "disttrain.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "disttrain.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "disttrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The operator pod's selector: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "disttrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "disttrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "disttrain.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "disttrain.trainerImage" -}}
{{- printf "%s:%s" .Values.trainer.image.repository (default .Chart.AppVersion .Values.trainer.image.tag) -}}
{{- end -}}

{{/* The CUDA trainer image for jobs that ask for GPUs; empty when trainer.gpu.image.repository is. */}}
{{- define "disttrain.trainerGpuImage" -}}
{{- with .Values.trainer.gpu.image.repository -}}
{{- printf "%s:%s" . (default (printf "%s-cuda" $.Chart.AppVersion) $.Values.trainer.gpu.image.tag) -}}
{{- end -}}
{{- end -}}
