{{- /*
The chart's own logic: what the values mean in the manifests' terms. The
generated templates (the kustomize manifests) call these where a value
sets a field.
*/ -}}

{{- /* The image of every gpupool container. */ -}}
{{- define "gpupool.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- /* "true" when the allocator runs on etcd: more than one replica, or an etcd named. */ -}}
{{- define "gpupool.etcd" -}}
{{- if or (gt (int .Values.controller.replicas) 1) .Values.etcd.endpoints }}true{{ end }}
{{- end }}

{{- /* "true" when the chart runs etcd itself. */ -}}
{{- define "gpupool.bundledEtcd" -}}
{{- if and (include "gpupool.etcd" .) (not .Values.etcd.endpoints) }}true{{ end }}
{{- end }}

{{- /* The stateless controllers' replicas: as many as the allocator's, at least 2. */ -}}
{{- define "gpupool.controllerReplicas" -}}
{{ max 2 (int .Values.controller.replicas) }}
{{- end }}

{{- /* gpupool-endpoints' data: every allocator replica's address, in order (a
standby answers 503 and clients try the next), and etcd's. */ -}}
{{- define "gpupool.endpoints" -}}
{{- $data := dict }}
{{- if include "gpupool.etcd" . }}
{{- $replicas := list }}
{{- range $i := until (int .Values.controller.replicas) }}
{{- $replicas = append $replicas (printf "https://gpupool-allocator-%d.gpupool-allocator-peers.%s.svc:8470" $i $.Release.Namespace) }}
{{- end }}
{{- $_ := set $data "allocator" (join "," $replicas) }}
{{- $_ := set $data "etcd" (join "," (.Values.etcd.endpoints | default (list (printf "http://gpupool-etcd.%s.svc:2379" .Release.Namespace)))) }}
{{- else }}
{{- $_ := set $data "allocator" (printf "https://gpupool-allocator.%s.svc:8470" .Release.Namespace) }}
{{- end }}
{{- toJson $data }}
{{- end }}

{{- /* The GPU nodes' labels, values as strings (`--set ...gpu=true` is a bool). */ -}}
{{- define "gpupool.gpuNodeSelector" -}}
{{- $selector := dict }}
{{- range $k, $v := .Values.devicePlugin.nodeSelector | default (dict "nvidia.com/gpu.present" "true") }}
{{- $_ := set $selector $k (toString $v) }}
{{- end }}
{{- toJson $selector }}
{{- end }}

{{- /* gpupool-kubernetes' data: the unit the webhook, gpupool-scheduler and the
device plugin share. */ -}}
{{- define "gpupool.kubernetesSettings" -}}
{{- toJson (dict "unit" (include "gpupool.unit" .) "gpu-memory" .Values.resources.gpu.gpuMemory "max-devices" (toString (.Values.resources.gpu.allocatable | default 0)) "default-topology" (include "gpupool.defaultTopology" .)) }}
{{- end }}

{{- /* The unit: resources.gpu.unit, or the articles' slices of GPU memory
(memoryPerUnit), not both. */ -}}
{{- define "gpupool.unit" -}}
{{- $gpu := .Values.resources.gpu }}
{{- if and $gpu.memoryPerUnit $gpu.unit }}
{{- fail (printf "resources.gpu.unit %s and resources.gpu.memoryPerUnit %s: the unit is one or the other (memoryPerUnit alone makes it slices of GPU memory)" $gpu.unit $gpu.memoryPerUnit) }}
{{- end }}
{{- if $gpu.memoryPerUnit }}memory:{{ $gpu.memoryPerUnit }}{{ else }}{{ $gpu.unit | default "percent" }}{{ end }}
{{- end }}

{{- /* BFK's affinityRules as the pool's default topology: the least link
between the GPUs of a pod of several that names none. gpu.socket is the
GPUs of one CPU socket; the schema allows one rule, of the keys below. */ -}}
{{- define "gpupool.defaultTopology" -}}
{{- $links := dict "gpu.socket" "socket" "gpu.pcie-switch" "pcie-switch" "gpu.nvlink" "nvlink" }}
{{- with .Values.scheduling.affinityRules }}{{ index $links (first .).topologyKey }}{{ else }}any{{ end }}
{{- end }}

{{- /* The placement policy. */ -}}
{{- define "gpupool.policy" -}}
{{- if .Values.scheduling.binPacking }}fgd-cpu{{ else }}spread{{ end }}
{{- end }}

{{- /* "true" when cert-manager issues the certificates. */ -}}
{{- /* Who serves v1beta1.external.metrics.k8s.io in the cluster, as
namespace/service: empty when no APIService is there (or with helm
template, which sees no cluster). */ -}}
{{- define "gpupool.apiServiceOwner" -}}
{{- $s := lookup "apiregistration.k8s.io/v1" "APIService" "" "v1beta1.external.metrics.k8s.io" }}
{{- if $s }}{{ dig "spec" "service" "namespace" "kube-apiserver" $s }}/{{ dig "spec" "service" "name" "local" $s }}{{ end }}
{{- end }}

{{- /* Whether the chart registers gpupool-adapter as the external-metrics
API: adapter.apiService true, or auto and no other service holds it (its
own from an earlier revision is its to keep). */ -}}
{{- define "gpupool.apiService" -}}
{{- $mode := toString .Values.adapter.apiService }}
{{- $owner := include "gpupool.apiServiceOwner" . }}
{{- if or (eq $mode "true") (and (eq $mode "auto") (or (not $owner) (eq $owner (printf "%s/gpupool-adapter" .Release.Namespace)))) }}true{{ end }}
{{- end }}

{{- /* NOTES.txt's word on the external-metrics API: which path serves
the HPA, and why. */ -}}
{{- define "gpupool.apiServiceNote" -}}
{{- $mode := toString .Values.adapter.apiService }}
{{- if include "gpupool.apiService" . -}}
registered as v1beta1.external.metrics.k8s.io for the HPA{{ if eq $mode "auto" }} (adapter.apiService: auto, and no other service held it){{ end }}
{{- else if eq $mode "auto" -}}
not registered as v1beta1.external.metrics.k8s.io: {{ include "gpupool.apiServiceOwner" . }} holds it (KEDA's metrics server, or prometheus-adapter), and adapter.apiService is auto; give that owner gpupool's queries (docs/adapter.md)
{{- else -}}
not registered as v1beta1.external.metrics.k8s.io (adapter.apiService: false)
{{- end }}
{{- end }}

{{- /* KEDA's namespace, where the hook Job copies KEDA's client certificate:
adapter.kedaNamespace while it exists. Helm's lookup sees kube-system in
any cluster (not the release's namespace, which --create-namespace makes
only after rendering): without it (helm template) there is no cluster to
ask, and it renders as though KEDA's were there. */ -}}
{{- define "gpupool.kedaNamespace" -}}
{{- $ns := .Values.adapter.kedaNamespace }}
{{- if eq $ns .Release.Namespace }}
{{- fail (printf "adapter.kedaNamespace %s: KEDA's client certificate is made there already (the release's namespace); name KEDA's own namespace, or leave it empty" $ns) }}
{{- end }}
{{- if and $ns (or (lookup "v1" "Namespace" "" $ns) (not (lookup "v1" "Namespace" "" "kube-system"))) }}{{ $ns }}{{ end }}
{{- end }}

{{- define "gpupool.certManager" -}}
{{- $mode := toString .Values.certs.certManager }}
{{- if or (eq $mode "true") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) }}true{{ end }}
{{- end }}

{{- /* The tokens values set: at least the 16 characters the allocator requires.
Unset, the hook Job gpupool-secrets makes them in the cluster (templates/secrets.yaml). */ -}}
{{- define "gpupool.checkTokens" -}}
{{- range $key, $token := dict "admin" .Values.tokens.admin "server" .Values.tokens.server }}
{{- if and $token (lt (len $token) 16) }}
{{- fail (printf "tokens.%s: %d characters is shorter than the 16 the allocator requires" $key (len $token)) }}
{{- end }}
{{- end }}
{{- end }}

{{- /* A workload's knobs (values.schema.json, $defs.component), as lines of
`key: JSON`: the values' (<component>.<knob>) where set, else the
manifest's (defaults). Every workload's template calls it through the
helpers of _knobs.tpl (generated from the schema), where each knob goes:
the pod spec, the container (resources), the pod's metadata
(podAnnotations, written as annotations, over the manifest's and the
checksums). nodeSelector's values are strings (`--set ...gpu=true` is a
bool). */ -}}
{{- define "gpupool.knobs" -}}
{{- $given := index .root.Values .component | default dict }}
{{- $lines := list }}
{{- range $knob := .knobs }}
{{- $default := index $.defaults $knob }}
{{- $v := index $given $knob }}
{{- if eq $knob "podAnnotations" }}
{{- $v = merge (dict) ($v | default dict) ($default | default dict) }}
{{- else if not $v }}
{{- $v = $default }}
{{- end }}
{{- if and $v (eq $knob "nodeSelector") }}
{{- $s := dict }}
{{- range $k, $x := $v }}{{ $_ := set $s $k (toString $x) }}{{ end }}
{{- $v = $s }}
{{- end }}
{{- if $v }}
{{- $lines = append $lines (printf "%s: %s" (ternary "annotations" $knob (eq $knob "podAnnotations")) (toJson $v)) }}
{{- end }}
{{- end }}
{{- join "\n" $lines }}
{{- end }}

{{- /* A workload's PodDisruptionBudget (<component>.podDisruptionBudget):
"true" unless enabled is false. */ -}}
{{- define "gpupool.disruptionBudgetEnabled" -}}
{{- $pdb := (index .root.Values .component | default dict).podDisruptionBudget | default dict }}
{{- if ne (toString (dig "enabled" true $pdb)) "false" }}true{{ end }}
{{- end }}

{{- /* Its minAvailable or maxUnavailable, as lines: the values' (one of the
two) where set, else the manifest's (defaults: maxUnavailable 1). */ -}}
{{- define "gpupool.disruptionBudget" -}}
{{- $pdb := (index .root.Values .component | default dict).podDisruptionBudget | default dict }}
{{- $lines := list }}
{{- range $k := list "minAvailable" "maxUnavailable" }}
{{- with index $pdb $k }}{{ $lines = append $lines (printf "%s: %s" $k (toJson .)) }}{{ end }}
{{- end }}
{{- if not $lines }}
{{- range $k, $v := .defaults }}{{ $lines = append $lines (printf "%s: %s" $k (toJson $v)) }}{{ end }}
{{- end }}
{{- join "\n" $lines }}
{{- end }}
