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
