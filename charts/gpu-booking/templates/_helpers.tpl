{{/* Names, labels and the pieces every pod shares. */}}

{{- define "gpu-booking.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name; components append "-api", "-webhook", ... so it stays under 52 characters. */}}
{{- define "gpu-booking.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-booking.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "ctx" $ "component" "api"). */}}
{{- define "gpu-booking.labels" -}}
helm.sh/chart: {{ include "gpu-booking.chart" .ctx }}
{{ include "gpu-booking.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: gpu-booking
{{- end }}

{{- define "gpu-booking.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-booking.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpu-booking.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Service names. */}}
{{- define "gpu-booking.apiName" -}}{{ include "gpu-booking.fullname" . }}-api{{- end }}
{{- define "gpu-booking.webhookName" -}}{{ include "gpu-booking.fullname" . }}-webhook{{- end }}
{{- define "gpu-booking.controllerName" -}}{{ include "gpu-booking.fullname" . }}-controller{{- end }}
{{- define "gpu-booking.agentName" -}}{{ include "gpu-booking.fullname" . }}-agent{{- end }}
{{/* Names of Jobs and CronJobs, cut to fit: a Job's name is a label value (63
characters), a CronJob's 52 (its Jobs add 11). */}}
{{- define "gpu-booking.cleanupNodesName" -}}{{ include "gpu-booking.fullname" . | trunc 49 | trimSuffix "-" }}-cleanup-nodes{{- end }}
{{- define "gpu-booking.backupName" -}}{{ include "gpu-booking.fullname" . | trunc 45 | trimSuffix "-" }}-backup{{- end }}
{{- define "gpu-booking.tokenRotationName" -}}{{ include "gpu-booking.fullname" . | trunc 46 | trimSuffix "-" }}-token{{- end }}
{{/* The CronJob's name must fit Kubernetes' 52 characters (its Jobs add 11): the
prefix is cut to 46 for this name only, so no other name changes. */}}
{{- define "gpu-booking.certsName" -}}{{ include "gpu-booking.fullname" . | trunc 46 | trimSuffix "-" }}-certs{{- end }}

{{/* The booking API as the other components reach it. */}}
{{- define "gpu-booking.apiUrl" -}}
http://{{ include "gpu-booking.apiName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.api.service.port }}
{{- end }}

{{/* The Secret holding the webhook's serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "gpu-booking.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "gpu-booking.webhookName" .)) .Values.tls.secretName }}
{{- end }}

{{- define "gpu-booking.webhookConfigName" -}}
{{- include "gpu-booking.webhookName" . }}
{{- end }}

{{/* Pod-level security context; agents pass their own. */}}
{{- define "gpu-booking.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{- define "gpu-booking.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext }}
{{- end }}

{{/* The Secret of the JWT key, service token (and embedded Postgres's password and
URL): the operator's existing one when named, else the one the bootstrap Job keeps. */}}
{{- define "gpu-booking.secretName" -}}
{{- default (printf "%s-secrets" (include "gpu-booking.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{/* Whether the bootstrap hook Job generates the Secret. */}}
{{- define "gpu-booking.bootstrapSecret" -}}
{{- if not .Values.secrets.existingSecret }}true{{ end }}
{{- end }}

{{- define "gpu-booking.postgresName" -}}{{ include "gpu-booking.fullname" . }}-postgres{{- end }}
{{- define "gpu-booking.cnpgName" -}}{{ include "gpu-booking.fullname" . }}-db{{- end }}

{{/* Where DATABASE_URL comes from, as a secretKeyRef's name and key, per database.mode.
The contradictions are refused here, at render time. */}}
{{- define "gpu-booking.databaseUrlRef" -}}
{{- $mode := .Values.database.mode }}
{{- if eq $mode "cloudnativepg" }}
{{- if not (.Capabilities.APIVersions.Has "postgresql.cnpg.io/v1/Cluster") }}
{{- fail "database.mode=cloudnativepg needs the CloudNativePG operator: its CRD postgresql.cnpg.io/v1 Cluster is not in this cluster (install the operator first, or pass --api-versions postgresql.cnpg.io/v1/Cluster to helm template)" }}
{{- end }}
{{- /* The operator's application Secret: key `uri` is a postgresql:// URL to the primary. */}}
name: {{ include "gpu-booking.cnpgName" . }}-app
key: uri
{{- else if eq $mode "external" }}
name: {{ required "database.mode=external: name the Secret that holds the URL (database.external.secretName or secrets.existingSecret)" (default .Values.secrets.existingSecret .Values.database.external.secretName) }}
key: {{ .Values.database.external.urlKey }}
{{- else }}
name: {{ include "gpu-booking.secretName" . }}
key: {{ .Values.secrets.databaseUrlKey }}
{{- end }}
{{- end }}

{{/* env entries every component gets. */}}
{{- define "gpu-booking.commonEnv" -}}
- name: GPU_BOOKING_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
{{- end }}

{{/* The token the webhook, controller and agent present to the API, as a file they
re-read when it changes: their own ServiceAccount's projected token (audience-bound,
rotated by the kubelet, verified by the API with a TokenReview), or, with
auth.serviceAccountTokens.enabled=false, the HS256 service token from the Secret. */}}
{{- define "gpu-booking.serviceTokenVolume" -}}
- name: service-token
{{- if .Values.auth.serviceAccountTokens.enabled }}
  projected:
    defaultMode: 0440
    sources:
      - serviceAccountToken:
          audience: {{ .Values.auth.serviceAccountTokens.audience | quote }}
          expirationSeconds: {{ .Values.auth.serviceAccountTokens.expirationSeconds }}
          path: service-token
{{- else }}
  secret:
    secretName: {{ include "gpu-booking.secretName" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.secrets.serviceTokenKey }}
        path: service-token
{{- end }}
{{- end }}

{{/* The ServiceAccounts the API trusts, NAMESPACE/NAME=ROLE, comma-separated. */}}
{{- define "gpu-booking.serviceAccountRoles" -}}
{{- $ns := .Release.Namespace }}
{{- $out := list (printf "%s/%s=service" $ns (include "gpu-booking.webhookName" .)) }}
{{- if .Values.controller.enabled }}{{ $out = append $out (printf "%s/%s=service" $ns (include "gpu-booking.controllerName" .)) }}{{ end }}
{{- if .Values.agent.enabled }}{{ $out = append $out (printf "%s/%s=service" $ns (include "gpu-booking.agentName" .)) }}{{ end }}
{{- range .Values.auth.serviceAccountTokens.extra }}{{ $out = append $out . }}{{ end }}
{{- join "," $out }}
{{- end }}

{{- define "gpu-booking.serviceTokenPath" -}}/var/run/secrets/gpu-booking/service-token/service-token{{- end }}

{{/* The booking service's options, the same variables in the webhook, the controller
and the agent (client::BookingServiceArgs). */}}
{{- define "gpu-booking.bookingServiceEnv" -}}
- name: GPU_BOOKING_BOOKING_URL
  value: {{ include "gpu-booking.apiUrl" . | quote }}
- name: GPU_BOOKING_SERVICE_TOKEN_FILE
  value: {{ include "gpu-booking.serviceTokenPath" . }}
{{- end }}

{{/* The priority classes, the same variables and values in the webhook, the
controller and the agent (core::admission::PriorityClassArgs): the webhook gives them,
the controller and the agent believe a pod booked only with the high one. */}}
{{- define "gpu-booking.priorityClassEnv" -}}
- name: GPU_BOOKING_HIGH_PRIORITY_CLASS
  value: {{ include "gpu-booking.priorityClassName" (list . "high") | quote }}
- name: GPU_BOOKING_LOW_PRIORITY_CLASS
  value: {{ include "gpu-booking.priorityClassName" (list . "low") | quote }}
{{- end }}

{{/* The name of our PriorityClass "high" or "low", called with (list $ "high"):
priorityClasses.<class>.name, else `<fullname>-<class>`. PriorityClasses are
cluster-wide: a name of its own per release lets two releases live in one cluster. */}}
{{- define "gpu-booking.priorityClassName" -}}
{{- $ctx := index . 0 }}
{{- $class := index . 1 }}
{{- (index $ctx.Values.priorityClasses $class).name | default (printf "%s-%s" (include "gpu-booking.fullname" $ctx) $class) }}
{{- end }}

{{/* The admission options, the same variables and values in the webhook and the
controller (core::admission::AdmissionArgs): the controller acts on what the webhook
wrote. */}}
{{- define "gpu-booking.admissionEnv" -}}
- name: GPU_BOOKING_TERMINATE_AT_ANNOTATION
  value: {{ .Values.webhook.terminateAtAnnotation | quote }}
- name: GPU_BOOKING_MODEL_NODE_LABEL
  value: {{ .Values.webhook.modelNodeLabel | quote }}
{{ include "gpu-booking.priorityClassEnv" . }}
- name: GPU_BOOKING_GPU_RESOURCE
  value: {{ join "," .Values.webhook.gpuResources | quote }}
- name: GPU_BOOKING_GPUMEM_RESOURCE
  value: {{ .Values.webhook.gpumemResource | quote }}
{{- end }}

{{- define "gpu-booking.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A soft spread of replicas over nodes, unless the component sets its own affinity. */}}
{{- define "gpu-booking.affinity" -}}
{{- if .values.affinity }}
{{- toYaml .values.affinity }}
{{- else }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "gpu-booking.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 12 }}
{{- end }}
{{- end }}

{{/* Scheduling fields shared by the Deployments; call with (dict "ctx" $ "values" .Values.api "component" "api"). */}}
{{- define "gpu-booking.scheduling" -}}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
  {{- include "gpu-booking.affinity" . | nindent 2 }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/* Per-model resources as JSON, MODEL: RESOURCE: webhook.modelResources and the
     `resource` of each model in models.declared (a model declared with its resource
     needs nothing else); the two must agree. */}}
{{- define "gpu-booking.modelResources" -}}
{{- $out := deepCopy (.Values.webhook.modelResources | default dict) }}
{{- range .Values.models.declared }}
{{- if .resource }}
{{- $was := get $out .name }}
{{- if and $was (ne $was .resource) }}
{{- fail (printf "model %s: models.declared gives the resource %s, webhook.modelResources %s" .name .resource $was) }}
{{- end }}
{{- $_ := set $out .name .resource }}
{{- end }}
{{- end }}
{{- $out | toJson }}
{{- end }}

{{/* The webhook's GPU resources: the generic ones and every per-model one. */}}
{{- define "gpu-booking.gpuResources" -}}
{{- $all := list }}
{{- range .Values.webhook.gpuResources }}{{ $all = append $all . }}{{ end }}
{{- range $model, $resource := include "gpu-booking.modelResources" . | fromJson }}{{ $all = append $all $resource }}{{ end }}
{{- $all | uniq | toJson }}
{{- end }}

{{/* Where the controller acts on pods, as a JSON list: ["*"] when it serves every
namespace (controller.namespace "*"), else controller.namespace and the namespaces of
controller.preemption.otherWorkloadNamespaces (where it only deletes). The webhook
lends cards to GPU pods without a user only there (--lend-namespaces): a card lent
anywhere else could never be taken back for a booked user. */}}
{{- define "gpu-booking.controllerNamespaces" -}}
{{- $served := .Values.controller.namespace }}
{{- if eq $served "*" }}
{{- list "*" | toJson }}
{{- else }}
{{- concat (list $served) (.Values.controller.preemption.otherWorkloadNamespaces | default list) | uniq | toJson }}
{{- end }}
{{- end }}

{{/* A map as "key=value,key=value" in key order, for the comma-separated options. */}}
{{- define "gpu-booking.pairs" -}}
{{- $out := list }}
{{- range $k, $v := . }}
{{- if kindIs "float64" $v }}{{ $v = int64 $v }}{{ end }}
{{- $out = append $out (printf "%s=%v" $k $v) }}
{{- end }}
{{- join "," $out }}
{{- end }}

{{/* CEL: "'r1' in c.resources.<field> || 'r2' in c.resources.<field>". */}}
{{- define "gpu-booking.celIn" -}}
{{- $field := .field }}
{{- $parts := list }}
{{- range .resources }}{{ $parts = append $parts (printf "'%s' in c.resources.%s" . $field) }}{{ end }}
{{- join " || " $parts }}
{{- end }}

{{/* The pod of every certificate job; call with (dict "ctx" $ "serviceAccount" NAME "skipMissing" BOOL). */}}
{{- define "gpu-booking.certsPodSpec" -}}
{{- $ := .ctx }}
{{- $mode := $.Values.tls.mode }}
serviceAccountName: {{ .serviceAccount }}
automountServiceAccountToken: true
restartPolicy: OnFailure
{{- include "gpu-booking.imagePullSecrets" $ }}
securityContext:
  {{- include "gpu-booking.podSecurityContext" $ | nindent 2 }}
containers:
  - name: certs
    image: {{ include "gpu-booking.image" $ }}
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    args: ["certs", {{ $mode | quote }}]
    env:
      {{- include "gpu-booking.commonEnv" $ | nindent 6 }}
      - name: GPU_BOOKING_CERTS_NAMESPACE
        valueFrom:
          fieldRef:
            fieldPath: metadata.namespace
      - name: GPU_BOOKING_CERTS_SERVICE
        value: {{ include "gpu-booking.webhookName" $ | quote }}
      - name: GPU_BOOKING_CERTS_SECRET
        value: {{ include "gpu-booking.tlsSecretName" $ | quote }}
      - name: GPU_BOOKING_CERTS_WEBHOOK_CONFIG
        value: {{ include "gpu-booking.webhookConfigName" $ | quote }}
      - name: GPU_BOOKING_CERTS_CLUSTER_DOMAIN
        value: {{ $.Values.tls.clusterDomain | quote }}
      {{- with $.Values.tls.extraDnsNames }}
      - name: GPU_BOOKING_CERTS_DNS_NAME
        value: {{ join "," . | quote }}
      {{- end }}
      - name: GPU_BOOKING_CERTS_RENEW_BEFORE
        value: {{ $.Values.tls.renewBefore | quote }}
      {{- if .skipMissing }}
      # Before install the webhook configuration does not exist yet: the post-install
      # job patches its caBundle.
      - name: GPU_BOOKING_CERTS_SKIP_MISSING_WEBHOOK_CONFIG
        value: "true"
      {{- end }}
      {{- if eq $mode "self-signed" }}
      - name: GPU_BOOKING_CERTS_CA_VALIDITY
        value: {{ $.Values.tls.selfSigned.caValidity | quote }}
      - name: GPU_BOOKING_CERTS_CERT_VALIDITY
        value: {{ $.Values.tls.selfSigned.certValidity | quote }}
      {{- else if eq $mode "csr" }}
      - name: GPU_BOOKING_CERTS_SIGNER_NAME
        value: {{ required "tls.csr.signerName is required in csr mode" $.Values.tls.csr.signerName | quote }}
      - name: GPU_BOOKING_CERTS_APPROVE
        value: {{ $.Values.tls.csr.approve | quote }}
      - name: GPU_BOOKING_CERTS_WAIT_TIMEOUT
        value: {{ $.Values.tls.csr.waitTimeout | quote }}
      {{- if $.Values.tls.csr.expirationSeconds }}
      - name: GPU_BOOKING_CERTS_EXPIRATION_SECONDS
        value: {{ $.Values.tls.csr.expirationSeconds | int64 | quote }}
      {{- end }}
      {{- if $.Values.tls.csr.caBundle }}
      - name: GPU_BOOKING_CERTS_CA_BUNDLE
        value: {{ $.Values.tls.csr.caBundle | quote }}
      {{- else }}
      # The cluster CA, which signs the built-in signers' certificates.
      - name: GPU_BOOKING_CERTS_CA_BUNDLE_FILE
        value: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
      {{- end }}
      {{- end }}
    resources:
      {{- toYaml $.Values.tls.job.resources | nindent 6 }}
    securityContext:
      {{- include "gpu-booking.containerSecurityContext" $ | nindent 6 }}
{{- end }}

{{/* DNS names of the webhook Service, as the API server and tools reach it. */}}
{{- define "gpu-booking.webhookDnsNames" -}}
{{- $svc := include "gpu-booking.webhookName" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.tls.clusterDomain) }}
{{- concat $names .Values.tls.extraDnsNames | uniq | toJson }}
{{- end }}

{{/* An ingress rule for the metrics port (9090), from networkPolicy.metricsFrom. */}}
{{- define "gpu-booking.metricsIngress" -}}
- ports:
    - port: metrics
      protocol: TCP
  {{- with .Values.networkPolicy.metricsFrom }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* models.declared as the API's models file (JSON, list order kept); a name declared
twice is refused here (the schema cannot say "unique by name"). */}}
{{- define "gpu-booking.declaredModels" -}}
{{- $seen := dict }}
{{- range .Values.models.declared }}
{{- if hasKey $seen .name }}{{ fail (printf "models.declared: model %q is declared twice" .name) }}{{ end }}
{{- $_ := set $seen .name true }}
{{- end }}
{{- .Values.models.declared | toJson }}
{{- end }}

{{/* DATABASE_URL as a file (the API's and migrate's --database-url-file), so the URL
and its password are in no process environment. */}}
{{- define "gpu-booking.databaseUrlEnv" -}}
- name: GPU_BOOKING_DATABASE_URL_FILE
  value: /var/run/secrets/gpu-booking/database/database-url
{{- end }}

{{- define "gpu-booking.databaseUrlMount" -}}
- name: database-url
  mountPath: /var/run/secrets/gpu-booking/database
  readOnly: true
{{- end }}

{{- define "gpu-booking.databaseUrlVolume" -}}
{{- $ref := include "gpu-booking.databaseUrlRef" . | fromYaml }}
- name: database-url
  secret:
    secretName: {{ $ref.name }}
    defaultMode: 0440
    items:
      - key: {{ $ref.key }}
        path: database-url
{{- end }}

{{/* A PodDisruptionBudget that never blocks a drain: rendered only when the component
runs more replicas than must stay up (with one replica, minAvailable 1 would refuse
every eviction); minAvailable at or over the replicas is refused. Call with
(dict "ctx" $ "values" .Values.api "component" "api" "name" NAME). */}}
{{- define "gpu-booking.pdb" -}}
{{- $pdb := .values.podDisruptionBudget }}
{{- $replicas := int .values.replicaCount }}
{{- if and $pdb.enabled (gt $replicas 1) }}
{{- $min := $pdb.minAvailable }}
{{- $blocks := false }}
{{- if kindIs "string" $min }}
{{- $blocks = ge (int (trimSuffix "%" $min)) 100 }}
{{- else }}
{{- $blocks = ge (int $min) $replicas }}
{{- end }}
{{- if $blocks }}
{{- fail (printf "%s.podDisruptionBudget.minAvailable (%v) must be under %s.replicaCount (%d), or no node could ever be drained" .component $min .component $replicas) }}
{{- end }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ .ctx.Release.Namespace }}
  labels:
    {{- include "gpu-booking.labels" (dict "ctx" .ctx "component" .component) | nindent 4 }}
spec:
  minAvailable: {{ $pdb.minAvailable }}
  selector:
    matchLabels:
      {{- include "gpu-booking.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 6 }}
{{- end }}
{{- end }}

{{/* A duration as the binaries read it (humantime: "2s", "1500ms", "14days", "1h 30m",
and Go's "720h0m0s") in milliseconds, for comparing values at render time. */}}
{{- define "gpu-booking.ms" -}}
{{- $units := dict "ns" 0.000001 "us" 0.001 "ms" 1.0 "s" 1000.0 "sec" 1000.0 "secs" 1000.0 "second" 1000.0 "seconds" 1000.0 "m" 60000.0 "min" 60000.0 "mins" 60000.0 "minute" 60000.0 "minutes" 60000.0 "h" 3600000.0 "hr" 3600000.0 "hrs" 3600000.0 "hour" 3600000.0 "hours" 3600000.0 "d" 86400000.0 "day" 86400000.0 "days" 86400000.0 "w" 604800000.0 "week" 604800000.0 "weeks" 604800000.0 "M" 2630016000.0 "month" 2630016000.0 "months" 2630016000.0 "y" 31557600000.0 "year" 31557600000.0 "years" 31557600000.0 }}
{{- $total := 0.0 }}
{{- $terms := regexFindAll "[0-9]+(\\.[0-9]+)?\\s*[a-zA-Z]+" (toString .) -1 }}
{{- if not $terms }}{{ fail (printf "%q is not a duration (e.g. 2s, 90min, 24h, 14days)" (toString .)) }}{{ end }}
{{- range $terms }}
{{- $n := regexFind "^[0-9]+(\\.[0-9]+)?" . }}
{{- $u := trim (trimPrefix $n .) }}
{{- if not (hasKey $units $u) }}{{ fail (printf "%q: unknown duration unit %q" . $u) }}{{ end }}
{{- $total = addf $total (mulf (float64 $n) (get $units $u)) }}
{{- end }}
{{- $total }}
{{- end }}
