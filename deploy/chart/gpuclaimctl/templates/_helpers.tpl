{{/*
Labels of every object: the kustomize base's, and the two Helm's own
conventions add (tests/test_chart.py allows exactly these two more).
*/}}
{{- define "gpuclaimctl.labels" -}}
app.kubernetes.io/name: gpuclaimctl
app.kubernetes.io/part-of: gpuclaimctl
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The controller's pods, as the Deployment, Service, PDB and ServiceMonitor select them. */}}
{{- define "gpuclaimctl.selectorLabels" -}}
app.kubernetes.io/name: gpuclaimctl
app.kubernetes.io/component: controller
{{- end -}}

{{- define "gpuclaimctl.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* `gpuclaimctl run`'s arguments: leader election, then .Values.flags in name order. */}}
{{- define "gpuclaimctl.args" -}}
- run
{{- if .Values.leaderElection.enabled }}
- --leader-elect
{{- else }}
- --no-leader-elect
{{- end }}
{{- range $flag, $value := .Values.flags }}
{{- if eq (kindOf $value) "bool" }}
- {{ ternary (printf "--%s" $flag) (printf "--no-%s" $flag) $value | quote }}
{{- else }}
- {{ printf "--%s=%v" $flag $value | quote }}
{{- end }}
{{- end }}
{{- end -}}
