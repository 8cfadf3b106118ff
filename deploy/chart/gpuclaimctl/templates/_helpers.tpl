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

{{/*
`gpuclaimctl run`'s arguments: leader election, then .Values.flags in name
order (a list: the flag once per item). values.schema.json refuses a flag
`run` does not have; a flag the chart sets itself passes the schema so that
this can say what sets it (_flags.tpl), which a schema error cannot.
*/}}
{{- define "gpuclaimctl.args" -}}
- run
{{- if .Values.leaderElection.enabled }}
- --leader-elect
{{- else }}
- --no-leader-elect
{{- end }}
{{- $notHere := include "gpuclaimctl.flagsNotHere" . | fromYaml }}
{{- range $flag, $value := .Values.flags }}
{{- with get $notHere $flag }}
{{- fail (printf "flags.%s is not allowed: %s" $flag .) }}
{{- end }}
{{- if eq (kindOf $value) "bool" }}
- {{ ternary (printf "--%s" $flag) (printf "--no-%s" $flag) $value | quote }}
{{- else if eq (kindOf $value) "slice" }}
{{- range $value }}
- {{ printf "--%s=%v" $flag . | quote }}
{{- end }}
{{- else }}
- {{ printf "--%s=%v" $flag $value | quote }}
{{- end }}
{{- end }}
{{- end -}}
