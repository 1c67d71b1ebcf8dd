{{/* Names and labels. */}}
{{- define "agentfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agentfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "agentfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "agentfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: pass (list $ "api"). */}}
{{- define "agentfleet.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "agentfleet.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "agentfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agentfleet.secretName" -}}
{{- default (include "agentfleet.fullname" .) .Values.secrets.name }}
{{- end }}

{{- define "agentfleet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The port of a listen address ("0.0.0.0:8080" -> 8080); fails on anything else. */}}
{{- define "agentfleet.port" -}}
{{- $port := regexFind "[0-9]+$" . }}
{{- if not (regexMatch "^.+:[0-9]+$" .) }}
{{- fail (printf "listen address %q must end in :PORT" .) }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
A setting's value as the binaries read it from the environment. YAML numbers reach templates
as float64: a whole one is printed as an integer (1000000000, not 1e+09).
*/}}
{{- define "agentfleet.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}
{{- int64 . | toString | quote }}
{{- else }}
{{- toString . | quote }}
{{- end }}
{{- end }}

{{/*
AGENTFLEET__SECTION__KEY entries of a nested settings map (config or secrets.values):
section -> key -> value, or models -> name -> key -> value.
*/}}
{{- define "agentfleet.envEntries" -}}
{{- range $section, $keys := . }}
{{- range $key, $value := $keys }}
{{- if kindIs "map" $value }}
{{- range $k, $v := $value }}
{{ printf "AGENTFLEET__%s__%s__%s" $section $key $k | upper }}: {{ include "agentfleet.envValue" $v }}
{{- end }}
{{- else }}
{{ printf "AGENTFLEET__%s__%s" $section $key | upper }}: {{ include "agentfleet.envValue" $value }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod-level spec shared by every pod of the chart. */}}
{{- define "agentfleet.podCommon" -}}
serviceAccountName: {{ include "agentfleet.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountToken }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Container-level settings shared by every container of the chart. */}}
{{- define "agentfleet.containerCommon" -}}
image: {{ include "agentfleet.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
envFrom:
  - configMapRef:
      name: {{ include "agentfleet.fullname" . }}
{{- include "agentfleet.secretsFileEnv" . }}
{{- end }}

{{/*
The secret settings reach the binaries as a TOML configuration file (`--config`, here
AGENTFLEET_CONFIG) mounted from the Secret, not as environment variables: a file is not
inherited by child processes nor shown by `kubectl describe`. The ConfigMap's variables apply
on top of it and carry no secret.
*/}}
{{- define "agentfleet.secretsFileEnv" }}
env:
  - name: AGENTFLEET_CONFIG
    value: /etc/agentfleet/secrets.toml
volumeMounts:
  - name: secrets
    mountPath: /etc/agentfleet
    readOnly: true
{{- end }}

{{/* The Secret volume of a pod; pass (list $ secretName). */}}
{{- define "agentfleet.secretsVolume" -}}
{{- $ := index . 0 -}}
volumes:
  - name: secrets
    secret:
      secretName: {{ index . 1 }}
      defaultMode: 0440
      items:
        - {key: secrets.toml, path: secrets.toml}
{{- end }}

{{/*
secrets.values as TOML: [section] key = "value", [models."name"] api_key = "…". Empty values
are left out (the code's default applies). toJson quotes a string as a valid TOML basic string.
*/}}
{{- define "agentfleet.secretsToml" -}}
{{- range $section, $keys := . }}
{{- if eq $section "models" }}
{{- range $name, $model := $keys }}
{{- if $model }}
[models.{{ $name | toJson }}]
{{- range $k, $v := $model }}
{{- if $v }}
{{ $k }} = {{ toString $v | toJson }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- else }}
[{{ $section }}]
{{- range $k, $v := $keys }}
{{- if $v }}
{{ $k }} = {{ toString $v | toJson }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Restarts pods when their settings change. */}}
{{- define "agentfleet.configChecksum" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if .Values.secrets.create }}
checksum/secret: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- end }}

{{/* Refuses values the binaries or the drain cannot work with. */}}
{{- define "agentfleet.validate" -}}
{{- $w := .Values.config.worker }}
{{- if not $w.metrics_listen }}
{{- fail "config.worker.metrics_listen must be set: the worker's probes and metrics are served there" }}
{{- end }}
{{- $drainS := add (div (int64 $w.drain_grace_ms) 1000) 10 }}
{{- if le (int64 .Values.worker.terminationGracePeriodSeconds) (int64 $drainS) }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%v) must exceed config.worker.drain_grace_ms/1000 + 10 s (%v): Kubernetes would kill the drain midway" .Values.worker.terminationGracePeriodSeconds $drainS) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.config.api.metrics_listen) }}
{{- fail "serviceMonitor.enabled needs config.api.metrics_listen" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (lt (int64 .Values.autoscaling.minReplicas) 1) }}
{{- fail "autoscaling.minReplicas must be at least 1: workers export the scaling signal" }}
{{- end }}
{{- if and .Values.api.pdb.enabled (kindIs "float64" .Values.api.pdb.minAvailable) (ge (int64 .Values.api.pdb.minAvailable) (int64 .Values.api.replicas)) }}
{{- fail (printf "api.pdb.minAvailable (%v) must be below api.replicas (%v), or no node could ever be drained" .Values.api.pdb.minAvailable .Values.api.replicas) }}
{{- end }}
{{- if and .Values.config.database.migrate_on_start .Values.migrations.enabled }}
{{- fail "config.database.migrate_on_start and migrations.enabled: choose one (the Job is the safe one)" }}
{{- end }}
{{- end }}

{{/*
Egress to public addresses: every range shared/src/egress.rs refuses is excepted (CI compares
the two). Tool calls (workers) and webhook deliveries (API) obey the same policy.
*/}}
{{- define "agentfleet.publicEgress" -}}
- to:
    - ipBlock:
        cidr: 0.0.0.0/0
        except:
          - 0.0.0.0/8       # "this network", unspecified
          - 10.0.0.0/8      # private
          - 100.64.0.0/10   # shared address space (CGNAT)
          - 127.0.0.0/8     # loopback
          - 169.254.0.0/16  # link-local, cloud metadata
          - 172.16.0.0/12   # private
          - 192.0.0.0/24    # IETF protocol assignments
          - 192.0.2.0/24    # documentation
          - 192.88.99.0/24  # 6to4 relay anycast
          - 192.168.0.0/16  # private
          - 198.18.0.0/15   # benchmarking
          - 198.51.100.0/24 # documentation
          - 203.0.113.0/24  # documentation
          - 224.0.0.0/4     # multicast
          - 240.0.0.0/4     # reserved, broadcast
    - ipBlock:
        cidr: ::/0
        except:
          - ::/96           # unspecified, loopback, IPv4-compatible
          - ::ffff:0:0:0/96 # IPv4-translated (SIIT)
          - 64:ff9b:1::/48  # local-use NAT64
          - 100::/64        # discard
          - 2001::/32       # Teredo
          - 2001:db8::/32   # documentation
          - fc00::/7        # unique local (fd00:ec2::254)
          - fe80::/10       # link-local
          - fec0::/10       # site-local
          - ff00::/8        # multicast
{{- end }}
