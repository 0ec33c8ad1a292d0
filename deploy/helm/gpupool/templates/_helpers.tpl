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
{{- $replicas = append $replicas (printf "https://gpupool-allocator-%d.gpupool-allocator-peers.gpupool.svc:8470" $i) }}
{{- end }}
{{- $_ := set $data "allocator" (join "," $replicas) }}
{{- $_ := set $data "etcd" (join "," (.Values.etcd.endpoints | default (list "http://gpupool-etcd.gpupool.svc:2379"))) }}
{{- else }}
{{- $_ := set $data "allocator" "https://gpupool-allocator.gpupool.svc:8470" }}
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
{{- define "gpupool.certManager" -}}
{{- $mode := toString .Values.certs.certManager }}
{{- if or (eq $mode "true") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) }}true{{ end }}
{{- end }}

{{- /* The chart's own CA and certificates, made once a render and kept across
upgrades: the CA from the Secret gpupool-ca when it exists, each leaf from
its Secret when that one was signed by the same CA. They serve only: no
component of the chart takes a client certificate. */ -}}
{{- define "gpupool.pki" -}}
{{- if not (hasKey .Values "__gpupoolPKI") }}
{{- $pki := dict }}
{{- $stored := lookup "v1" "Secret" "gpupool" "gpupool-ca" }}
{{- $ca := dict }}
{{- if $stored }}
{{- $ca = buildCustomCert (index $stored.data "ca.crt") (index $stored.data "ca.key") }}
{{- else }}
{{- $ca = genCA "gpupool-ca" 3650 }}
{{- end }}
{{- $_ := set $pki "ca" $ca }}
{{- $leaves := dict }}
{{- range $name, $spec := dict
    "gpupool-allocator-tls" (dict "cn" "gpupool-allocator.gpupool.svc" "dns" (list "gpupool-allocator.gpupool.svc" "gpupool-allocator.gpupool.svc.cluster.local" "*.gpupool-allocator-peers.gpupool.svc" "*.gpupool-allocator-peers.gpupool.svc.cluster.local") "signer" $ca "ca" $ca)
    "gpupool-adapter-tls" (dict "cn" "gpupool-adapter.gpupool.svc" "dns" (list "gpupool-adapter.gpupool.svc" "gpupool-adapter.gpupool.svc.cluster.local") "signer" $ca "ca" $ca)
    "gpupool-webhook-tls" (dict "cn" "gpupool-webhook.gpupool.svc" "dns" (list "gpupool-webhook.gpupool.svc" "gpupool-webhook.gpupool.svc.cluster.local") "signer" $ca "ca" $ca) }}
{{- $old := lookup "v1" "Secret" "gpupool" $name }}
{{- $leaf := dict "ca.crt" $spec.ca.Cert }}
{{- if and $old (eq (index $old.data "ca.crt" | default "" | b64dec) $spec.ca.Cert) (hasKey $old.data "tls.crt") }}
{{- $_ := set $leaf "tls.crt" (index $old.data "tls.crt" | b64dec) }}
{{- $_ := set $leaf "tls.key" (index $old.data "tls.key" | b64dec) }}
{{- else }}
{{- $cert := genSignedCert $spec.cn nil $spec.dns 365 $spec.signer }}
{{- $_ := set $leaf "tls.crt" $cert.Cert }}
{{- $_ := set $leaf "tls.key" $cert.Key }}
{{- end }}
{{- $_ := set $leaves $name $leaf }}
{{- end }}
{{- $_ := set $pki "leaves" $leaves }}
{{- $_ := set .Values "__gpupoolPKI" $pki }}
{{- end }}
{{- end }}

{{- /* The caBundle field where the chart's CA is the one to trust; nothing
where cert-manager's CA injector fills it. */ -}}
{{- define "gpupool.caBundleField" -}}
{{- if not (include "gpupool.certManager" .) }}
{{- include "gpupool.pki" . }}caBundle: {{ .Values.__gpupoolPKI.ca.Cert | b64enc }}
{{- end }}
{{- end }}

{{- /* The allocator's tokens: as set, else as stored, else new. */ -}}
{{- define "gpupool.tokens" -}}
{{- if not (hasKey .Values "__gpupoolTokens") }}
{{- $stored := (lookup "v1" "Secret" "gpupool" "gpupool-tokens").data | default dict }}
{{- $tokens := dict }}
{{- range $key, $value := dict "admin" .Values.tokens.admin "server" .Values.tokens.server }}
{{- $token := $value | default (index $stored (printf "%s-token" $key) | default "" | b64dec) | default (randAlphaNum 48) }}
{{- if lt (len $token) 16 }}
{{- fail (printf "tokens.%s: %d characters is shorter than the 16 the allocator requires" $key (len $token)) }}
{{- end }}
{{- $_ := set $tokens $key $token }}
{{- end }}
{{- $_ := set .Values "__gpupoolTokens" $tokens }}
{{- end }}
{{- end }}
