{{/* The component: frontend or node-local; anything else fails the rendering. */}}
{{- define "watchsan.component" -}}
{{- if not (has .Values.mode (list "frontend" "node-local")) -}}
{{- fail (printf "mode must be frontend or node-local, not %q" (toString .Values.mode)) -}}
{{- end -}}
{{- .Values.mode -}}
{{- end -}}

{{/* The name of every object: .Values.name, or deploy/base's (watchsan-frontend, watchsan-node-local). */}}
{{- define "watchsan.name" -}}
{{- .Values.name | default (printf "watchsan-%s" (include "watchsan.component" .)) -}}
{{- end -}}

{{/* Selector labels: the same as deploy/base's, so a release can take over its objects (a selector is immutable). */}}
{{- define "watchsan.selectorLabels" -}}
app.kubernetes.io/name: watchsan
app.kubernetes.io/component: {{ include "watchsan.component" . }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "watchsan.labels" -}}
{{ include "watchsan.selectorLabels" . }}
app.kubernetes.io/part-of: watchsan
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ include "watchsan.tag" . | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "watchsan.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "watchsan.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (include "watchsan.tag" .) -}}
{{- end -}}
{{- end -}}

{{- define "watchsan.tlsSecretName" -}}
{{- .Values.tlsSecretName | default (printf "%s-tls" (include "watchsan.name" .)) -}}
{{- end -}}

{{/*
watchsan's --config file. The frontend: TLS on the pod IP, the clients' own credentials
(no-credentials), the admin listener on the pod IP with its reviews sent with the projected
token. node-local: TLS and admin on the node's loopback, no-credentials.
*/}}
{{- define "watchsan.config" -}}
{{- $c := dict -}}
{{- if eq (include "watchsan.component" .) "frontend" -}}
{{- $_ := set $c "listen" (printf "0.0.0.0:%v" .Values.frontend.port) -}}
{{- $_ := set $c "admin-listen" (printf "0.0.0.0:%v" .Values.frontend.adminPort) -}}
{{- $_ := set $c "admin-auth-token-file" "/var/run/secrets/watchsan/admin-auth/token" -}}
{{- $_ := set $c "shutdown-delay" .Values.frontend.shutdownDelay -}}
{{- $_ := set $c "shutdown-timeout" .Values.frontend.shutdownTimeout -}}
{{- else -}}
{{- $_ := set $c "listen" (printf "127.0.0.1:%v" .Values.nodeLocal.port) -}}
{{- $_ := set $c "admin-listen" (printf "127.0.0.1:%v" .Values.nodeLocal.adminPort) -}}
{{- end -}}
{{- $_ := set $c "tls-cert-file" "/etc/watchsan/tls/tls.crt" -}}
{{- $_ := set $c "tls-private-key-file" "/etc/watchsan/tls/tls.key" -}}
{{- $_ := set $c "no-credentials" true -}}
{{- $_ := set $c "upstream" .Values.upstreams -}}
{{- $_ := set $c "upstream-ca-file" "/etc/watchsan/upstream-ca/ca.crt" -}}
{{- $_ := set $c "log-format" .Values.logFormat -}}
{{- toYaml (mergeOverwrite $c (deepCopy .Values.extraConfig)) -}}
{{- end -}}

{{/* The container's hardening, the same in both modes. */}}
{{- define "watchsan.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "watchsan.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The volumes both modes mount: the config, the serving certificate, the upstream CA. */}}
{{- define "watchsan.volumeMounts" -}}
- name: config
  mountPath: /etc/watchsan/config
  readOnly: true
- name: tls
  mountPath: /etc/watchsan/tls
  readOnly: true
- name: upstream-ca
  mountPath: /etc/watchsan/upstream-ca
  readOnly: true
{{- end -}}

{{- define "watchsan.volumes" -}}
- name: config
  configMap:
    name: {{ include "watchsan.name" . }}-config
- name: tls
  secret:
    secretName: {{ include "watchsan.tlsSecretName" . }}
    defaultMode: 0440
- name: upstream-ca
  configMap:
    name: {{ .Values.upstreamCA.configMap }}
    items:
      - key: {{ .Values.upstreamCA.key }}
        path: ca.crt
{{- end -}}

{{/* Pod template metadata: the selector labels, and the config's hash so a change rolls the pods. */}}
{{- define "watchsan.podMetadata" -}}
labels:
  {{- include "watchsan.selectorLabels" . | nindent 2 }}
  {{- with .Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ include "watchsan.config" . | sha256sum }}
  {{- with .Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
