{{/* Names, labels and the pieces every template shares. */}}

{{- define "embedgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "embedgate.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: include "embedgate.selector" (list $ "gateway") */}}
{{- define "embedgate.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "embedgate.modelsVolume" -}}
- name: models
{{- if .Values.models.hostPath }}
  hostPath:
    path: {{ .Values.models.hostPath }}
    type: Directory
{{- else }}
  persistentVolumeClaim:
    claimName: {{ required "models.persistentVolumeClaim or models.hostPath is required" .Values.models.persistentVolumeClaim }}
    readOnly: true
{{- end }}
{{- end -}}

{{- define "embedgate.metricsAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: {{ .path | quote }}
{{- end }}
{{- end -}}

{{/* Stable DNS name of PS pod <ordinal> of host <name>: the StatefulSet's pods behind its headless Service. */}}
{{- define "embedgate.psPod" -}}
{{- $root := index . 0 -}}
{{- $svc := printf "%s-ps-%s" (include "embedgate.fullname" $root) (index . 1) -}}
{{- printf "%s-%d.%s.%s.svc:%d" $svc (index . 2) $svc $root.Release.Namespace (int $root.Values.tfServing.grpcPort) -}}
{{- end -}}

{{/* The models: section shared by the gateway and updater configs: every PS pod that holds a shard is a replica. */}}
{{- define "embedgate.modelsSection" -}}
models:
  - kind: embedding
    name: {{ .Values.model.name }}
    manifest: /models/{{ .Values.model.name }}
    entry: {{ printf "%s-entry:%d" (include "embedgate.fullname" .) (int .Values.tfServing.grpcPort) }}
    shards:
{{- range $shard := until (int .Values.model.shards) }}
      - replicas:
{{- $found := false }}
{{- range $host := $.Values.psHosts }}
{{- range $s := $host.shards }}
{{- if eq (int $s) $shard }}
{{- $found = true }}
{{- range $ordinal := until (int $.Values.ps.replicas) }}
          - {{ include "embedgate.psPod" (list $ $host.name $ordinal) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if not $found }}
{{- fail (printf "shard %d is on no PS host: every shard in 0..%d must be listed in psHosts" $shard (sub (int $.Values.model.shards) 1)) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* PS memory request in MiB of a pod serving N shards, called with (list $ N):
     ps.baselineMi + ps.writeBuffersMi + N x rowsPerShard x (MB per million rows) x headroom, where MB per million
     rows is 32 + 1.1 x rowBytes x dim for the slab layout (the scale ladder's cost per row, python -m
     benchmarks.scale) and 180 + 6.4 x dim for the hash layout (benchmarks.export_bench, with every row written once
     more); the baseline is the server's own memory with no rows, writeBuffersMi what it keeps after write calls
     (docs/deployment.md "Sizing"). */}}
{{- define "embedgate.psMemoryMi" -}}
{{- $root := index . 0 -}}
{{- $shards := int (index . 1) -}}
{{- $dim := int $root.Values.model.dim -}}
{{- $perMillion10 := add 1800 (mul 64 $dim) -}}
{{- if ne (toString $root.Values.model.psLayout) "hash" -}}
{{- $perMillion10 = add 320 (mul 11 (mul (int $root.Values.model.rowBytes) $dim)) -}}
{{- end -}}
{{- $perShard := div (mul (int $root.Values.model.rowsPerShard) $perMillion10) 10000000 -}}
{{- $rows := mulf (float64 (mul $perShard $shards)) (float64 $root.Values.ps.headroom) -}}
{{- $fixed := add (int $root.Values.ps.baselineMi) (int $root.Values.ps.writeBuffersMi) -}}
{{- printf "%dMi" (int (ceil (addf (float64 $fixed) $rows))) -}}
{{- end -}}
