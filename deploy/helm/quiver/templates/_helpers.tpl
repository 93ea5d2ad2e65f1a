{{/* The prefix of every object's name: the release name when it holds
"quiver" (helm install quiver ...: quiver-csi-controller), else
<release>-quiver. */}}
{{- define "quiver.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; component labels add
app.kubernetes.io/component. */}}
{{- define "quiver.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels of one component: (list $ "csi-controller"). */}}
{{- define "quiver.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The quiver image; the tag defaults to the chart's appVersion. */}}
{{- define "quiver.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}

{{/* A sidecar's image: (include "quiver.sidecarImage" .Values.sidecars.provisioner). */}}
{{- define "quiver.sidecarImage" -}}
{{- printf "%s:%s" .image (.tag | toString) -}}
{{- end -}}

{{/* The quiver API's URL as pods reach it. */}}
{{- define "quiver.apiAddress" -}}
{{- include "quiver.validate" . -}}
{{- if .Values.storage.node.address -}}
{{- .Values.storage.node.address -}}
{{- else if .Values.storage.node.enabled -}}
{{- printf "http://%s.%s.svc:%v" (include "quiver.fullname" .) .Release.Namespace .Values.storage.node.apiPort -}}
{{- else -}}
{{- .Values.storage.external.address -}}
{{- end -}}
{{- end -}}

{{/* The NBD server's host:port as nodes reach it. */}}
{{- define "quiver.nbdAddress" -}}
{{- include "quiver.validate" . -}}
{{- if .Values.storage.node.nbdAddress -}}
{{- .Values.storage.node.nbdAddress -}}
{{- else if .Values.storage.node.enabled -}}
{{- printf "%s.%s.svc:%v" (include "quiver.fullname" .) .Release.Namespace .Values.storage.node.nbdPort -}}
{{- else if .Values.storage.external.nbdAddress -}}
{{- .Values.storage.external.nbdAddress -}}
{{- else -}}
{{- $u := urlParse .Values.storage.external.address -}}
{{- printf "%s:10809" (splitList ":" $u.host | first) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the API token, and its key. */}}
{{- define "quiver.tokenSecret" -}}
{{- .Values.token.existingSecret | default (printf "%s-api-token" (include "quiver.fullname" .)) -}}
{{- end -}}
{{- define "quiver.tokenKey" -}}
{{- if .Values.token.existingSecret -}}{{ .Values.token.key | default "token" }}{{- else -}}token{{- end -}}
{{- end -}}

{{/* The pod volume of the API token, always mounted at /etc/quiver/token. */}}
{{- define "quiver.tokenVolume" -}}
- name: api-token
  secret:
    secretName: {{ include "quiver.tokenSecret" . }}
    items:
      - key: {{ include "quiver.tokenKey" . }}
        path: token
{{- end -}}

{{/* Refuses values that cannot make a working install, naming the value. */}}
{{- define "quiver.validate" -}}
{{- $s := .Values.storage -}}
{{- if and $s.node.enabled $s.external.address -}}
{{- fail "storage: set one of storage.node.enabled (a storage node run by the chart) and storage.external.address (a quiver server outside), not both" -}}
{{- end -}}
{{- if not (or $s.node.enabled $s.external.address) -}}
{{- fail "storage: set storage.node.enabled=true (a storage node run by the chart) or storage.external.address (the URL of a quiver API, e.g. http://10.0.0.5:7480)" -}}
{{- end -}}
{{- if and $s.node.enabled (or $s.node.address $s.node.nbdAddress) (not (and $s.node.address $s.node.nbdAddress)) -}}
{{- fail "storage.node: set both address and nbdAddress, or neither (the Service's name)" -}}
{{- end -}}
{{- if and $s.node.address (not (regexMatch "^https?://[^/]+$" $s.node.address)) -}}
{{- fail (printf "storage.node.address %q: want http://host:port or https://host:port" $s.node.address) -}}
{{- end -}}
{{- if $s.external.address -}}
{{- if not (regexMatch "^https?://[^/]+$" $s.external.address) -}}
{{- fail (printf "storage.external.address %q: want http://host:port or https://host:port" $s.external.address) -}}
{{- end -}}
{{- if not (or .Values.token.existingSecret .Values.token.value) -}}
{{- fail "token: with storage.external.address, set token.existingSecret (a Secret holding that server's token) or token.value; a generated token is unknown to an external server" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.token.existingSecret .Values.token.value -}}
{{- fail "token: set token.existingSecret or token.value, not both" -}}
{{- end -}}
{{- if and .Values.webhook.certManager.enabled .Values.webhook.existingSecret -}}
{{- fail "webhook: set webhook.certManager.enabled or webhook.existingSecret, not both" -}}
{{- end -}}
{{- $names := dict -}}
{{- range $i, $c := .Values.storageClasses -}}
{{- if not (kindIs "map" $c) -}}
{{- fail (printf "storageClasses[%d]: want a map with name, parameters, ... (a --set of one entry replaces the whole list: give every entry)" $i) -}}
{{- end -}}
{{- if not $c.name -}}
{{- fail (printf "storageClasses[%d]: name is required" $i) -}}
{{- end -}}
{{- if hasKey $names $c.name -}}
{{- fail (printf "storageClasses[%d]: name %q is used twice" $i $c.name) -}}
{{- end -}}
{{- $_ := set $names $c.name true -}}
{{- if not (has ($c.volumeBindingMode | default "Immediate") (list "Immediate" "WaitForFirstConsumer")) -}}
{{- fail (printf "storageClasses[%d] (%s): volumeBindingMode %q: want Immediate or WaitForFirstConsumer" $i $c.name $c.volumeBindingMode) -}}
{{- end -}}
{{- end -}}
{{- end -}}
