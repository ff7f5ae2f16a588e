{{/* The CSI driver name: fixed, the driver's topology key derives from it. */}}
{{- define "localvol.driverName" -}}localvol.csi.dev{{- end }}

{{/* Resource name prefix: the release name if it contains "localvol", else <release>-localvol. */}}
{{- define "localvol.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "localvol.labels" -}}
app.kubernetes.io/name: localvol
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "localvol.selectorLabels" -}}
app.kubernetes.io/name: localvol
app.kubernetes.io/component: node
{{- end }}

{{- define "localvol.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end }}

{{/* "<repository>:<tag>" of a sidecar's image values. */}}
{{- define "localvol.sidecarImage" -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end }}

{{- define "localvol.socketDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) (include "localvol.driverName" .) -}}
{{- end }}

{{/* "true" when a pool is an LVM pool (the DaemonSet then gets lvm's host paths). */}}
{{- define "localvol.hasLvm" -}}
{{- $lvm := false -}}
{{- range .Values.pools }}{{ if eq .type "lvm" }}{{ $lvm = true }}{{ end }}{{ end -}}
{{- $lvm -}}
{{- end }}

{{/* "true" when a discovery class is of volumeMode Block. */}}
{{- define "localvol.hasBlockDiscovery" -}}
{{- $block := false -}}
{{- range .Values.discovery.classes }}{{ if eq .volumeMode "Block" }}{{ $block = true }}{{ end }}{{ end -}}
{{- $block -}}
{{- end }}

{{/* Dir pools whose path is not below dataDir.path: they get their own mount. */}}
{{- define "localvol.extraPoolMounts" -}}
{{- $data := printf "%s/" (trimSuffix "/" .Values.dataDir.path) -}}
{{- range .Values.pools }}
{{- if and (eq .type "dir") (or .device (not (hasPrefix $data .path))) }}
{{- /* A pool on its own disk: the driver mounts it, so the mount must reach the
       host (Bidirectional) and outlive a restart of the container. */}}
{{- $dev := not (empty .device) }}
- {{ dict "name" .name "path" .path "type" (default (ternary "DirectoryOrCreate" "Directory" $dev) .hostPathType) "propagation" (ternary "Bidirectional" "HostToContainer" $dev) | toJson }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when a dir pool names a device (the driver needs the host's /dev). */}}
{{- define "localvol.hasDevicePool" -}}
{{- $dev := false -}}
{{- range .Values.pools }}{{ if and (eq .type "dir") .device }}{{ $dev = true }}{{ end }}{{ end -}}
{{- $dev -}}
{{- end }}

{{/* config.yaml for the driver: the pool config without chart-only keys. */}}
{{- define "localvol.config" -}}
{{- $pools := list -}}
{{- range .Values.pools -}}
{{- $pools = append $pools (omit . "hostPathType") -}}
{{- end -}}
{{- $cfg := dict "pools" $pools "maxVolumesPerNode" .Values.maxVolumesPerNode -}}
{{- if .Values.defaultPool -}}
{{- $_ := set $cfg "defaultPool" .Values.defaultPool -}}
{{- end -}}
{{- if .Values.discovery.classes -}}
{{- $classes := list -}}
{{- range .Values.discovery.classes -}}
{{- $classes = append $classes (omit . "hostPathType" "reclaimPolicy" "storageClassParameters") -}}
{{- end -}}
{{- $d := dict "classes" $classes -}}
{{- if .Values.discovery.stateDir -}}
{{- $_ := set $d "stateDir" .Values.discovery.stateDir -}}
{{- end -}}
{{- $_ := set $cfg "discovery" $d -}}
{{- end -}}
{{- with .Values.orphans -}}
{{- $_ := set $cfg "orphans" . -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end }}

{{/* The node plugin's PriorityClass name ("" for none). */}}
{{- define "localvol.priorityClassName" -}}
{{- if .Values.priorityClass.create -}}
{{- printf "%s-node-critical" (include "localvol.fullname" .) -}}
{{- else -}}
{{- .Values.priorityClass.name -}}
{{- end -}}
{{- end }}
