{{/* Chart name. */}}
{{- define "safe-termination.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects (Service, webhook configuration, RBAC). */}}
{{- define "safe-termination.fullname" -}}
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

{{- define "safe-termination.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "safe-termination.selectorLabels" -}}
app.kubernetes.io/name: {{ include "safe-termination.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "safe-termination.labels" -}}
helm.sh/chart: {{ include "safe-termination.chart" . }}
{{ include "safe-termination.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: safe-termination
{{- end -}}

{{- define "safe-termination.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "safe-termination.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret the pods mount tls.crt/tls.key from. */}}
{{- define "safe-termination.tlsSecretName" -}}
{{- if eq .Values.certificates.mode "existingSecret" -}}
{{- required "certificates.existingSecret.name is required with certificates.mode existingSecret" .Values.certificates.existingSecret.name -}}
{{- else -}}
{{- default (printf "%s-tls" (include "safe-termination.fullname" .)) .Values.certificates.secretName -}}
{{- end -}}
{{- end -}}

{{- define "safe-termination.leaseName" -}}
{{- default (printf "%s-leader" (include "safe-termination.fullname" .)) .Values.operator.leaseName -}}
{{- end -}}

{{- define "safe-termination.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* caBundle for mode existingSecret: accepts PEM (text before it, as openssl prints, is
allowed) or base64 of the PEM (wrapped lines too, as `base64` writes them); renders one base64
line, and fails on anything else. */}}
{{- define "safe-termination.existingCaBundle" -}}
{{- $ca := required "certificates.existingSecret.caBundle is required with certificates.mode existingSecret" .Values.certificates.existingSecret.caBundle | trim -}}
{{- if contains "-----BEGIN CERTIFICATE-----" $ca -}}
{{- $pem := print "-----BEGIN CERTIFICATE-----" (join "-----BEGIN CERTIFICATE-----" (rest (splitList "-----BEGIN CERTIFICATE-----" $ca))) -}}
{{- $pem | b64enc -}}
{{- else -}}
{{- $b64 := regexReplaceAll "\\s+" $ca "" -}}
{{- if not (contains "-----BEGIN CERTIFICATE-----" (b64dec $b64)) -}}
{{- fail "certificates.existingSecret.caBundle is neither a PEM certificate nor base64 of one" -}}
{{- end -}}
{{- $b64 -}}
{{- end -}}
{{- end -}}

{{/*
Whether the MutatingWebhookConfiguration is rendered: not with admission.backend policy, nor
with auto where the API server serves MutatingAdmissionPolicy v1 (the operator then uses the
policy). "true" or empty.
*/}}
{{- define "safe-termination.webhookEnabled" -}}
{{- $backend := .Values.admission.backend -}}
{{- $served := .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
{{- if or (eq $backend "webhook") (and (eq $backend "auto") (not $served)) -}}true{{- end -}}
{{- end -}}

{{/*
The namespaceSelector of both admission backends (the webhook configuration and the policy
binding): not kube-system, not the release namespace, not webhook.excludeNamespaces, not
labelled safetermination.io/ignore=true, and the extra terms of webhook.namespaceSelector.
*/}}
{{- define "safe-termination.namespaceSelector" -}}
{{- $excluded := concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq -}}
{{- $exprs := list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded) (dict "key" "safetermination.io/ignore" "operator" "NotIn" "values" (list "true")) -}}
{{- $exprs = concat $exprs (.Values.webhook.namespaceSelector.matchExpressions | default list) -}}
{{- $sel := dict "matchExpressions" $exprs -}}
{{- with .Values.webhook.namespaceSelector.matchLabels }}{{- $_ := set $sel "matchLabels" . -}}{{- end -}}
{{- toJson $sel -}}
{{- end -}}

{{/* Whether the node agent DaemonSet is installed: "true" or "". agent.enabled true or false
as set; auto (README.md "Node agent"): only with operator.source auto and certificates.mode
operator, and unless kube-proxy's ConfigMap (kubeadm's `kube-proxy`, key config.conf, in
operator.kubeProxy.namespace) binds its metrics beyond loopback. Under `helm template` the
lookup finds nothing, so auto renders the agent. */}}
{{- define "safe-termination.agentEnabled" -}}
{{- $enabled := toString .Values.agent.enabled -}}
{{- if eq $enabled "true" -}}
true
{{- else if eq $enabled "auto" -}}
{{- if and (eq .Values.operator.source "auto") (eq .Values.certificates.mode "operator") -}}
{{- /* observing removals needs an agent on every node, wherever kube-proxy's metrics bind */ -}}
{{- if or (eq (toString .Values.agent.observeRemovals) "true") (eq (include "safe-termination.kubeProxyMetricsOnLoopback" .) "true") -}}
true
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" unless kube-proxy's ConfigMap (kubeadm's `kube-proxy` in
operator.kubeProxy.namespace) binds its metrics beyond loopback; no ConfigMap (or no lookup, as
under `helm template`) counts as loopback. */}}
{{- define "safe-termination.kubeProxyMetricsOnLoopback" -}}
{{- $cm := lookup "v1" "ConfigMap" .Values.operator.kubeProxy.namespace "kube-proxy" -}}
{{- $conf := "" -}}
{{- if and $cm $cm.data -}}
{{- $conf = index $cm.data "config.conf" | default "" -}}
{{- end -}}
{{- include "safe-termination.configBindsMetricsOnLoopback" $conf -}}
{{- end -}}

{{/* "true" unless the KubeProxyConfiguration text given (config.conf) sets
metricsBindAddress to a non-loopback host (0.0.0.0:10249, a node IP): unset, empty, 127.x, ::1
and localhost are loopback (kube-proxy's default is 127.0.0.1:10249), and so is text that is not
YAML. */}}
{{- define "safe-termination.configBindsMetricsOnLoopback" -}}
{{- $conf := fromYaml (toString .) -}}
{{- $bind := "" -}}
{{- if not (hasKey $conf "Error") -}}
{{- $bind = toString (default "" (get $conf "metricsBindAddress")) | trim -}}
{{- end -}}
{{- $host := regexReplaceAll ":[0-9]*$" $bind "" | trimPrefix "[" | trimSuffix "]" -}}
{{- if or (eq $host "") (eq $host "localhost") (eq $host "::1") (eq $bind "::1") (hasPrefix "127." $host) -}}
true
{{- end -}}
{{- end -}}

{{/* Namespace of the agents and their Secret. */}}
{{- define "safe-termination.agentNamespace" -}}
{{- default .Release.Namespace .Values.agent.namespace -}}
{{- end -}}

{{/* The agents' DaemonSet name. */}}
{{- define "safe-termination.agentName" -}}
{{- printf "%s-agent" (include "safe-termination.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret the operator writes for the agents. */}}
{{- define "safe-termination.agentSecretName" -}}
{{- default (printf "%s-agent-tls" (include "safe-termination.fullname" .)) .Values.agent.secretName -}}
{{- end -}}

{{/* The agents' PriorityClass: agent.priorityClassName, else the chart's. */}}
{{- define "safe-termination.agentPriorityClassName" -}}
{{- default (printf "%s-node-critical" (include "safe-termination.fullname" .) | trunc 63 | trimSuffix "-") .Values.agent.priorityClassName -}}
{{- end -}}

{{/* Selector labels of the agent pods: a name of their own, so that the operator's Service,
PDB and Deployment never select them. */}}
{{- define "safe-termination.agentSelectorLabels" -}}
app.kubernetes.io/name: {{ include "safe-termination.name" . }}-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{/* The operator's --agent-selector: the agent pods' selector labels. */}}
{{- define "safe-termination.agentSelector" -}}
{{- printf "app.kubernetes.io/name=%s-agent,app.kubernetes.io/instance=%s,app.kubernetes.io/component=agent" (include "safe-termination.name" .) .Release.Name -}}
{{- end -}}
