// Package helm tests the rlfn-rls chart by rendering it with Helm's own engine and decoding
// every manifest into the Kubernetes API types, strictly (an unknown field fails): there is
// no cluster here to install into. A module of its own, so that the main module does not
// carry Helm's and Kubernetes' dependencies.
package helm

import (
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// manifests are one rendering, decoded.
type manifests struct {
	deployment *appsv1.Deployment
	service    *corev1.Service
	configMap  *corev1.ConfigMap
	pdb        *policyv1.PodDisruptionBudget
	job        *batchv1.Job
	monitor    *monitoringv1.ServiceMonitor
	account    *corev1.ServiceAccount
	// objects are every manifest's kind and metadata, in no order.
	objects []object
}

type object struct {
	Kind     string
	Metadata metav1.ObjectMeta
}

// parseValues reads values as helm install's --values file.
func parseValues(values string) (map[string]any, error) {
	var vals map[string]any
	err := yaml.Unmarshal([]byte(values), &vals)
	return vals, err
}

func render(t *testing.T, values string) (*manifests, error) {
	t.Helper()
	return renderRelease(t, "edge", values)
}

// renderRelease renders the chart as helm install RELEASE does in the namespace rl.
func renderRelease(t *testing.T, release, values string) (*manifests, error) {
	t.Helper()
	vals, err := parseValues(values)
	if err != nil {
		t.Fatal(err)
	}
	return renderValues(t, release, vals)
}

// renderValues renders the chart with vals, as helm install RELEASE does in the namespace rl.
func renderValues(t *testing.T, release string, vals map[string]any) (*manifests, error) {
	t.Helper()
	chrt, err := loader.Load("rlfn-rls")
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(chrt, vals, chartutil.ReleaseOptions{Name: release, Namespace: "rl", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(chrt, rv)
	if err != nil {
		return nil, err
	}
	recordRendered(vals)
	m := &manifests{}
	for name, text := range files {
		if !strings.HasSuffix(name, ".yaml") || strings.TrimSpace(text) == "" {
			continue
		}
		var head object
		if err := yaml.Unmarshal([]byte(text), &head); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, text)
		}
		m.objects = append(m.objects, head)
		var into any
		switch head.Kind {
		case "Deployment":
			m.deployment = &appsv1.Deployment{}
			into = m.deployment
		case "Service":
			m.service = &corev1.Service{}
			into = m.service
		case "ConfigMap":
			m.configMap = &corev1.ConfigMap{}
			into = m.configMap
		case "PodDisruptionBudget":
			m.pdb = &policyv1.PodDisruptionBudget{}
			into = m.pdb
		case "Job":
			m.job = &batchv1.Job{}
			into = m.job
		case "ServiceAccount":
			m.account = &corev1.ServiceAccount{}
			into = m.account
		case "ServiceMonitor":
			m.monitor = &monitoringv1.ServiceMonitor{}
			into = m.monitor
		default:
			t.Fatalf("%s: unexpected kind %q", name, head.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(text), into); err != nil {
			t.Fatalf("%s does not decode as a %s: %v\n%s", name, head.Kind, err, text)
		}
	}
	return m, nil
}

func args(d *appsv1.Deployment) string {
	return strings.Join(d.Spec.Template.Spec.Containers[0].Args, " ")
}

// minimal is what an install must give besides the defaults: the limits (the chart has
// none of its own).
const minimal = `
config:
  configMap:
    files:
      ratelimit.yaml: |
        domain: edge
        descriptors:
          - key: remote_address
            rate_limit: {unit: minute, requests_per_unit: 100}
`

// The defaults: the service from a ConfigMap, its Service, a PodDisruptionBudget, the
// deploy Job as a pre-install and pre-upgrade hook, no ServiceMonitor.
func TestChartDefaults(t *testing.T) {
	m, err := render(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	if m.deployment == nil || m.service == nil || m.configMap == nil || m.pdb == nil || m.job == nil || m.monitor != nil {
		t.Fatalf("rendered %+v", m)
	}
	d := m.deployment
	if *d.Spec.Replicas != 2 || !strings.Contains(args(d), "--config=/etc/rlfn-rls/config") || !strings.Contains(args(d), "--instances=2") {
		t.Errorf("deployment: replicas %d, args %s", *d.Spec.Replicas, args(d))
	}
	pod := d.Spec.Template.Spec
	if pod.Volumes[0].ConfigMap == nil || pod.Volumes[0].ConfigMap.Name != m.configMap.Name || len(m.configMap.Data) != 1 || !strings.Contains(m.configMap.Data["ratelimit.yaml"], "requests_per_unit: 100") {
		t.Errorf("the configuration volume %+v, ConfigMap %s %v", pod.Volumes, m.configMap.Name, m.configMap.Data)
	}
	c := pod.Containers[0]
	if c.Env[0].Name != "RLFN_URL" || c.Env[0].Value != "redis://valkey:6379" {
		t.Errorf("env %+v", c.Env)
	}
	if c.ReadinessProbe.HTTPGet.Path != "/healthcheck" || !*c.SecurityContext.ReadOnlyRootFilesystem || !*pod.SecurityContext.RunAsNonRoot {
		t.Errorf("probe %+v, security %+v", c.ReadinessProbe, c.SecurityContext)
	}
	for k, v := range m.service.Spec.Selector {
		if d.Spec.Template.Labels[k] != v || m.pdb.Spec.Selector.MatchLabels[k] != v {
			t.Errorf("selector %s=%s does not select the pods", k, v)
		}
	}
	if m.pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("pdb %+v", m.pdb.Spec)
	}
	if m.job.Annotations["helm.sh/hook"] != "pre-install,pre-upgrade" || strings.Join(m.job.Spec.Template.Spec.Containers[0].Args, " ") != "deploy --yes" {
		t.Errorf("job %v %v", m.job.Annotations, m.job.Spec.Template.Spec.Containers[0].Args)
	}
	if jc := m.job.Spec.Template.Spec.Containers[0]; len(jc.Env) != 1 || len(m.job.Spec.Template.Spec.Volumes) != 0 || jc.Image != "rlfn/rlfn:dev" {
		t.Errorf("job without serverCA: env %+v, volumes %+v, image %s", jc.Env, m.job.Spec.Template.Spec.Volumes, jc.Image)
	}
	// The Job's pod is no pod of the service: its Service and budget do not count it.
	selected := true
	for k, v := range m.service.Spec.Selector {
		selected = selected && m.job.Spec.Template.Labels[k] == v
	}
	if selected {
		t.Errorf("the Service selects the deploy Job's pod: %v", m.job.Spec.Template.Labels)
	}
	if strings.Contains(args(d), "--reconcile") || strings.Contains(args(d), "--metrics") || len(m.service.Spec.Ports) != 2 {
		t.Errorf("args %s, ports %v: options not asked for", args(d), m.service.Spec.Ports)
	}
}

// everyOption sets every documented value.
const everyOption = `
replicas: 3
urlSecret: {name: rls-user, key: address}
serverCA: {secret: valkey-ca, key: ca.pem}
config:
  source: xds
  xds: {server: envoy-gateway:18001, node: edge-gateway, tlsSecret: envoy-rate-limit}
grpcTLS: {secret: rls-tls, clientAuth: true}
image: {repository: registry.example/rlfn/rlfn-rls, tag: 1.3.0, pullPolicy: Always}
fallback: local
readinessPath: /healthcheck
resources: {requests: {cpu: 250m, memory: 128Mi}, limits: {memory: 512Mi}}
deadline: 50ms
headers: draft
extraArgs: [--denial-cache=10000]
metricsPort: 19001
reconcile: true
podDisruptionBudget: {enabled: true, minAvailable: 2}
serviceMonitor: {enabled: true, interval: 15s, labels: {release: prometheus}}
deployJob:
  image: {repository: registry.example/rlfn/rlfn, tag: 1.3.1, pullPolicy: Never}
  urlSecret: {name: deployer-user, key: deployer-url}
  acceptWarnings: [lua-security]
`

// Every documented option, together: URLs from Secrets (the service's and the deployer's
// ACL users), the server's CA, the configuration over xDS with mutual TLS, mutual TLS on
// the gRPC listener, a ServiceMonitor.
func TestChartEveryOption(t *testing.T) {
	m, err := render(t, everyOption)
	if err != nil {
		t.Fatal(err)
	}
	if m.configMap != nil || m.monitor == nil {
		t.Fatalf("ConfigMap %v, ServiceMonitor %v", m.configMap, m.monitor)
	}
	a := args(m.deployment)
	for _, want := range []string{"--xds-server=envoy-gateway:18001", "--xds-node=edge-gateway", "--xds-tls-cert=/etc/rlfn-rls/xds-tls/tls.crt",
		"--xds-tls-key=/etc/rlfn-rls/xds-tls/tls.key", "--xds-tls-ca=/etc/rlfn-rls/xds-tls/ca.crt", "--grpc-tls-key=/etc/rlfn-rls/grpc-tls/tls.key",
		"--grpc-tls-cert=/etc/rlfn-rls/grpc-tls/tls.crt", "--grpc-tls-client-ca=/etc/rlfn-rls/grpc-tls/ca.crt",
		"--fallback=local", "--instances=3", "--denial-cache=10000", "--metrics=:19001", "--reconcile", "--deadline=50ms", "--headers=draft"} {
		if !strings.Contains(a, want) {
			t.Errorf("args %s lack %s", a, want)
		}
	}
	if strings.Contains(a, "--config") {
		t.Errorf("args %s: --config with xDS", a)
	}
	secrets := map[string]string{}
	for _, v := range m.deployment.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = v.Secret.SecretName
		}
	}
	if secrets["xds-tls"] != "envoy-rate-limit" || secrets["grpc-tls"] != "rls-tls" || secrets["server-ca"] != "valkey-ca" {
		t.Errorf("secret volumes %v", secrets)
	}
	c := m.deployment.Spec.Template.Spec.Containers[0]
	env := c.Env
	if len(env) != 2 || env[0].ValueFrom.SecretKeyRef.Name != "rls-user" || env[0].ValueFrom.SecretKeyRef.Key != "address" ||
		env[1].Name != "RLFN_TLS_CA" || env[1].Value != "/etc/rlfn-rls/server-ca/ca.pem" {
		t.Errorf("the service's variables %+v", env)
	}
	if *m.deployment.Spec.Replicas != 3 || c.Image != "registry.example/rlfn/rlfn-rls:1.3.0" || c.ImagePullPolicy != corev1.PullAlways ||
		c.ReadinessProbe.HTTPGet.Path != "/healthcheck" ||
		c.Resources.Requests.Cpu().String() != "250m" || c.Resources.Requests.Memory().String() != "128Mi" || c.Resources.Limits.Memory().String() != "512Mi" {
		t.Errorf("replicas %d, image %s (%s), readiness %s, resources %+v", *m.deployment.Spec.Replicas, c.Image, c.ImagePullPolicy, c.ReadinessProbe.HTTPGet.Path, c.Resources)
	}
	if m.pdb == nil || m.pdb.Spec.MinAvailable.IntValue() != 2 {
		t.Errorf("pdb %+v", m.pdb)
	}
	if strings.Contains(a, "--tls-ca") {
		t.Errorf("args %s: --tls-ca, which a plain URL refuses", a)
	}
	job := m.job.Spec.Template.Spec.Containers[0]
	if job.Env[0].ValueFrom.SecretKeyRef.Name != "deployer-user" || job.Env[0].ValueFrom.SecretKeyRef.Key != "deployer-url" ||
		strings.Join(job.Args, " ") != "deploy --yes --accept-warning=lua-security" {
		t.Errorf("job %+v %v", job.Env, job.Args)
	}
	if job.Image != "registry.example/rlfn/rlfn:1.3.1" || job.ImagePullPolicy != corev1.PullNever {
		t.Errorf("the Job's image %s (%s)", job.Image, job.ImagePullPolicy)
	}
	// The Job's image has no CA bundle: it gets the servers' CA as the service does.
	jobPod := m.job.Spec.Template.Spec
	if len(job.Env) != 2 || job.Env[1].Name != "RLFN_TLS_CA" || job.Env[1].Value != "/etc/rlfn/server-ca/ca.pem" ||
		len(job.VolumeMounts) != 1 || job.VolumeMounts[0].MountPath != "/etc/rlfn/server-ca" ||
		len(jobPod.Volumes) != 1 || jobPod.Volumes[0].Name != job.VolumeMounts[0].Name || jobPod.Volumes[0].Secret.SecretName != "valkey-ca" {
		t.Errorf("the Job's CA: env %+v, mounts %+v, volumes %+v", job.Env, job.VolumeMounts, jobPod.Volumes)
	}
	eps := m.monitor.Spec.Endpoints
	if m.monitor.Labels["release"] != "prometheus" || len(eps) != 1 || eps[0].Path != "/metrics" || eps[0].Port != "metrics" || eps[0].Interval != "15s" {
		t.Errorf("ServiceMonitor %+v", m.monitor)
	}
	for k, v := range m.monitor.Spec.Selector.MatchLabels {
		if m.service.Labels[k] != v {
			t.Errorf("the ServiceMonitor's selector %s=%s does not select the Service %v", k, v, m.service.Labels)
		}
	}
	// The metrics port, named as the ServiceMonitor names it, on the pod and the Service.
	var servicePort, podPort bool
	for _, p := range m.service.Spec.Ports {
		servicePort = servicePort || p.Name == "metrics" && p.Port == 19001 && p.TargetPort.String() == "metrics"
	}
	for _, p := range m.deployment.Spec.Template.Spec.Containers[0].Ports {
		podPort = podPort || p.Name == "metrics" && p.ContainerPort == 19001
	}
	if !servicePort || !podPort {
		t.Errorf("metrics port: Service %v, pod %v", m.service.Spec.Ports, m.deployment.Spec.Template.Spec.Containers[0].Ports)
	}
}

// Values that cannot work are refused at rendering, saying which.
func TestChartRefuses(t *testing.T) {
	for values, want := range map[string]string{
		"config: {source: consul}": "at '/config/source': value must be one of 'configMap', 'xds'",
		"config: {source: xds}":    "config.xds.server is required",
		// No limits of the chart's own: the user's are required.
		"":                                 "config.source configMap needs config.configMap.files",
		"config: {configMap: {files: {}}}": "config.source configMap needs config.configMap.files",
		"config: {configMap: {existing: limits, files: {a.yaml: 'domain: a'}}}": "existing and files both set",
		// The Job would use url, the default, while the service's URL sits in a Secret.
		minimal + "urlSecret: {name: rls-user}":            "deployJob.urlSecret.name is not",
		minimal + `url: ""`:                                "url or urlSecret.name is required",
		minimal + "deployJob: {enabled: false}\nurl: \"\"": "url or urlSecret.name is required",
	} {
		if _, err := render(t, values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", values, err, want)
		}
	}
	// Without the Job, the service's Secret alone is enough.
	m, err := render(t, minimal+"urlSecret: {name: rls-user}\ndeployJob: {enabled: false}")
	if err != nil || m.job != nil || m.deployment.Spec.Template.Spec.Containers[0].Env[0].ValueFrom.SecretKeyRef.Name != "rls-user" {
		t.Errorf("urlSecret without the Job: %v, %+v", err, m)
	}
}

// Readiness follows the fallback: /healthcheck (the backend's health) only with return_error,
// where Envoy's failure_mode_deny is the fallback; with one of the service's own, a replica
// whose backend is down must stay in the Service to apply it, so /ready (a configuration is
// loaded: over xDS, a replica without its first one stays out).
// readinessPath overrides either, for a --policy in extraArgs.
func TestChartReadinessFollowsFallback(t *testing.T) {
	for values, want := range map[string]string{
		"":                       "/healthcheck",
		"fallback: return_error": "/healthcheck",
		"fallback: local":        "/ready",
		"fallback: fail_open":    "/ready",
		"fallback: fail_closed":  "/ready",
		"fallback: local\nreadinessPath: /healthcheck":                                                       "/healthcheck",
		"extraArgs: [--policy=edge:fallback=fail_open]\nreadinessPath: /ready":                               "/ready",
		"config:\n  source: xds\n  xds: {server: \"xds:18000\"}\nfallback: local":                            "/ready",
		"fallback: fail_open\nextraArgs: [--policy=edge:fallback=return_error]\nreadinessPath: /healthcheck": "/healthcheck",
	} {
		m, err := render(t, minimal+values)
		if err != nil {
			t.Fatalf("%s: %v", values, err)
		}
		c := m.deployment.Spec.Template.Spec.Containers[0]
		if p := c.ReadinessProbe.HTTPGet; p.Path != want || p.Port.String() != "http" {
			t.Errorf("%q: readiness %s on %s, want %s", values, p.Path, p.Port.String(), want)
		}
		if c.LivenessProbe.HTTPGet.Path != "/metrics" {
			t.Errorf("%q: liveness %s", values, c.LivenessProbe.HTTPGet.Path)
		}
	}
}

// The user's files are the ConfigMap's only files: the chart's defaults hold none that Helm's
// merge of maps would keep beside them (a second domain edge, or a limit nobody asked for).
func TestChartConfigMapFiles(t *testing.T) {
	m, err := render(t, `
config:
  configMap:
    files:
      limits.yaml: |
        domain: api
        descriptors:
          - key: user
            rate_limit: {unit: second, requests_per_unit: 5}
      more.yaml: "domain: web\n"
`)
	if err != nil {
		t.Fatal(err)
	}
	data := m.configMap.Data
	if len(data) != 2 || !strings.Contains(data["limits.yaml"], "domain: api") || data["more.yaml"] != "domain: web\n" {
		t.Errorf("ConfigMap data %v, want limits.yaml and more.yaml alone", data)
	}
}

// The images' tags follow each other: the Job's is the service's unless given, and the
// service's the chart's appVersion (dev) unless given, so that setting image.tag alone deploys
// the release the service embeds.
func TestChartImageTags(t *testing.T) {
	for values, want := range map[string][2]string{
		"":                    {"rlfn/rlfn-rls:dev", "rlfn/rlfn:dev"},
		"image: {tag: 1.3.0}": {"rlfn/rlfn-rls:1.3.0", "rlfn/rlfn:1.3.0"},
		"image: {tag: 1.3.0}\ndeployJob: {image: {tag: 1.3.1}}": {"rlfn/rlfn-rls:1.3.0", "rlfn/rlfn:1.3.1"},
		"deployJob: {image: {tag: 1.3.1}}":                      {"rlfn/rlfn-rls:dev", "rlfn/rlfn:1.3.1"},
	} {
		m, err := render(t, minimal+values)
		if err != nil {
			t.Fatalf("%s: %v", values, err)
		}
		svc, job := m.deployment.Spec.Template.Spec.Containers[0].Image, m.job.Spec.Template.Spec.Containers[0].Image
		if svc != want[0] || job != want[1] {
			t.Errorf("%q: images %s and %s, want %s and %s", values, svc, job, want[0], want[1])
		}
		tag := want[0][strings.LastIndex(want[0], ":")+1:]
		if v := m.deployment.Spec.Template.Labels["app.kubernetes.io/version"]; v != tag {
			t.Errorf("%q: the pods' version label %s, the image's tag %s", values, v, tag)
		}
	}
}

// servicePorts are a Service's ports by name.
func servicePorts(s *corev1.Service) map[string]corev1.ServicePort {
	ports := map[string]corev1.ServicePort{}
	for _, p := range s.Spec.Ports {
		ports[p.Name] = p
	}
	return ports
}

// Mutual TLS on gRPC leaves the http port off the Service: its POST /json decides with no
// client certificate. The pods keep it for the probes, and a ServiceMonitor then scrapes the
// metrics port (without one it would scrape a port the Service lacks: refused).
func TestChartClientAuthClosesHTTP(t *testing.T) {
	m, err := render(t, minimal+"grpcTLS: {secret: rls-tls, clientAuth: true}")
	if err != nil {
		t.Fatal(err)
	}
	ports := servicePorts(m.service)
	if _, ok := ports["http"]; ok || len(ports) != 1 || ports["grpc"].Port != 8081 {
		t.Errorf("Service ports %v, want grpc alone", m.service.Spec.Ports)
	}
	c := m.deployment.Spec.Template.Spec.Containers[0]
	if c.ReadinessProbe.HTTPGet.Port.String() != "http" || len(c.Ports) != 2 || c.Ports[1].Name != "http" {
		t.Errorf("the pod's ports %v, probe %v", c.Ports, c.ReadinessProbe.HTTPGet)
	}
	m, err = render(t, minimal+"grpcTLS: {secret: rls-tls, clientAuth: true}\nmetricsPort: 19001\nserviceMonitor: {enabled: true}")
	if err != nil {
		t.Fatal(err)
	}
	ports = servicePorts(m.service)
	if _, ok := ports["http"]; ok || ports["metrics"].Port != 19001 || m.monitor.Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("Service ports %v, ServiceMonitor %+v", m.service.Spec.Ports, m.monitor.Spec.Endpoints)
	}
	// TLS without client certificates keeps the http port: nothing there is bypassed.
	m, err = render(t, minimal+"grpcTLS: {secret: rls-tls}")
	if err != nil {
		t.Fatal(err)
	}
	if ports := servicePorts(m.service); ports["http"].Port != 8080 {
		t.Errorf("Service ports %v with TLS alone", m.service.Spec.Ports)
	}
	if a := args(m.deployment); !strings.Contains(a, "--grpc-tls-cert=/etc/rlfn-rls/grpc-tls/tls.crt") || !strings.Contains(a, "--grpc-tls-key=/etc/rlfn-rls/grpc-tls/tls.key") || strings.Contains(a, "--grpc-tls-client-ca") {
		t.Errorf("TLS alone: args %s", a)
	}
	for values, want := range map[string]string{
		"grpcTLS: {secret: rls-tls, clientAuth: true}\nserviceMonitor: {enabled: true}": "serviceMonitor with grpcTLS.clientAuth needs metricsPort",
		"grpcTLS: {clientAuth: true}": "grpcTLS.clientAuth needs grpcTLS.secret",
	} {
		if _, err := render(t, minimal+values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", values, err, want)
		}
	}
}

// production sets the values a production cluster asks for: scheduling, a private registry,
// pod annotations and labels, a ServiceAccount, a priority, a strategy.
const production = `
imagePullSecrets: [{name: registry-credentials}]
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/name: rlfn-rls}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector: {matchLabels: {app.kubernetes.io/name: rlfn-rls}}
nodeSelector: {kubernetes.io/os: linux, pool: edge}
tolerations: [{key: dedicated, operator: Equal, value: edge, effect: NoSchedule}]
priorityClassName: edge-critical
podAnnotations: {sidecar.istio.io/inject: "false", rlfn.dev/config: mine}
podLabels: {team: edge, app.kubernetes.io/name: mine}
serviceAccount: {create: true}
strategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 0, maxSurge: 1}}
deployJob:
  resources: {requests: {cpu: 20m, memory: 32Mi}, limits: {memory: 64Mi}}
`

// The production values reach the pods they are for: scheduling, the registry's Secret and
// the priority both pods (the Job's too must be pulled and placed); affinity, spread and the
// strategy the service's; annotations and labels both, the chart's own labels and checksum
// winning; no ServiceAccount token in either; the Job's resources.
func TestChartProduction(t *testing.T) {
	m, err := render(t, minimal+production)
	if err != nil {
		t.Fatal(err)
	}
	pod, job := m.deployment.Spec.Template, m.job.Spec.Template
	for name, p := range map[string]corev1.PodSpec{"service": pod.Spec, "job": job.Spec} {
		if len(p.ImagePullSecrets) != 1 || p.ImagePullSecrets[0].Name != "registry-credentials" || p.PriorityClassName != "edge-critical" ||
			p.NodeSelector["pool"] != "edge" || p.NodeSelector["kubernetes.io/os"] != "linux" ||
			len(p.Tolerations) != 1 || p.Tolerations[0].Key != "dedicated" || p.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
			t.Errorf("%s: pull secrets %v, priority %q, node selector %v, tolerations %v", name, p.ImagePullSecrets, p.PriorityClassName, p.NodeSelector, p.Tolerations)
		}
		if p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
			t.Errorf("%s: automountServiceAccountToken %v", name, p.AutomountServiceAccountToken)
		}
	}
	ps := pod.Spec
	if ps.Affinity == nil || ps.Affinity.PodAntiAffinity == nil || len(ps.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(ps.TopologySpreadConstraints) != 1 || ps.TopologySpreadConstraints[0].TopologyKey != "topology.kubernetes.io/zone" {
		t.Errorf("affinity %+v, spread %+v", ps.Affinity, ps.TopologySpreadConstraints)
	}
	if job.Spec.Affinity != nil || len(job.Spec.TopologySpreadConstraints) != 0 {
		t.Errorf("the Job's pod has the service's affinity %+v or spread %+v", job.Spec.Affinity, job.Spec.TopologySpreadConstraints)
	}
	s := m.deployment.Spec.Strategy
	if s.Type != "RollingUpdate" || s.RollingUpdate.MaxUnavailable.IntValue() != 0 || s.RollingUpdate.MaxSurge.IntValue() != 1 {
		t.Errorf("strategy %+v", s)
	}
	// The chart's labels and checksum win over the user's: the selectors still select.
	if pod.Labels["team"] != "edge" || pod.Labels["app.kubernetes.io/name"] != "rlfn-rls" || job.Labels["team"] != "edge" || job.Labels["app.kubernetes.io/name"] != "rlfn" {
		t.Errorf("labels: service %v, job %v", pod.Labels, job.Labels)
	}
	if pod.Annotations["sidecar.istio.io/inject"] != "false" || job.Annotations["sidecar.istio.io/inject"] != "false" || pod.Annotations["rlfn.dev/config"] == "mine" || job.Annotations["rlfn.dev/config"] != "mine" {
		t.Errorf("annotations: service %v, job %v", pod.Annotations, job.Annotations)
	}
	for k, v := range m.deployment.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("the Deployment's selector %s=%s does not select its pods %v", k, v, pod.Labels)
		}
	}
	// The ServiceAccount created, without a token; the Job, before it exists, keeps the default.
	if m.account == nil || ps.ServiceAccountName != m.account.Name || m.account.AutomountServiceAccountToken == nil || *m.account.AutomountServiceAccountToken || job.Spec.ServiceAccountName != "" {
		t.Errorf("ServiceAccount %+v, service's %q, Job's %q", m.account, ps.ServiceAccountName, job.Spec.ServiceAccountName)
	}
	r := m.job.Spec.Template.Spec.Containers[0].Resources
	if r.Requests.Cpu().String() != "20m" || r.Requests.Memory().String() != "32Mi" || r.Limits.Memory().String() != "64Mi" {
		t.Errorf("the Job's resources %+v", r)
	}
}

// An existing ServiceAccount is both pods'; none given, the namespace's default (no name),
// and neither mounts a token; the Job has requests by default, for a ResourceQuota.
func TestChartServiceAccountAndJobResources(t *testing.T) {
	m, err := render(t, minimal+"serviceAccount: {name: edge-rls}")
	if err != nil {
		t.Fatal(err)
	}
	if m.account != nil || m.deployment.Spec.Template.Spec.ServiceAccountName != "edge-rls" || m.job.Spec.Template.Spec.ServiceAccountName != "edge-rls" {
		t.Errorf("an existing account: created %v, service's %q, Job's %q", m.account, m.deployment.Spec.Template.Spec.ServiceAccountName, m.job.Spec.Template.Spec.ServiceAccountName)
	}
	m, err = render(t, minimal+"serviceAccount: {create: true, name: edge-rls}")
	if err != nil {
		t.Fatal(err)
	}
	if m.account == nil || m.account.Name != "edge-rls" || m.deployment.Spec.Template.Spec.ServiceAccountName != "edge-rls" || m.job.Spec.Template.Spec.ServiceAccountName != "" {
		t.Errorf("a named account created: %v, service's %q, Job's %q", m.account, m.deployment.Spec.Template.Spec.ServiceAccountName, m.job.Spec.Template.Spec.ServiceAccountName)
	}
	m, err = render(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]corev1.PodSpec{"service": m.deployment.Spec.Template.Spec, "job": m.job.Spec.Template.Spec} {
		if p.ServiceAccountName != "" || p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
			t.Errorf("%s: account %q, token %v", name, p.ServiceAccountName, p.AutomountServiceAccountToken)
		}
	}
	if m.account != nil || m.deployment.Spec.Strategy.Type != "" {
		t.Errorf("defaults: account %v, strategy %+v", m.account, m.deployment.Spec.Strategy)
	}
	r := m.job.Spec.Template.Spec.Containers[0].Resources
	if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
		t.Errorf("the Job's default resources %+v", r)
	}
}

// The PodDisruptionBudget only where it lets a pod go: not over one replica, whose budget
// of 1 would block every node drain, and not disabled; a minAvailable of every replica is
// refused for the same reason; a percentage is taken as it is.
func TestChartDisruptionBudget(t *testing.T) {
	for values, want := range map[string]string{
		"":                                      "1",
		"replicas: 1":                           "",
		"podDisruptionBudget: {enabled: false}": "",
		"replicas: 3\npodDisruptionBudget: {minAvailable: 2}": "2",
		"podDisruptionBudget: {minAvailable: 50%}":            "50%",
		"replicas: 1\npodDisruptionBudget: {minAvailable: 1}": "",
	} {
		m, err := render(t, minimal+values)
		if err != nil {
			t.Fatalf("%q: %v", values, err)
		}
		switch {
		case want == "" && m.pdb != nil:
			t.Errorf("%q: a budget %+v", values, m.pdb.Spec)
		case want != "" && (m.pdb == nil || m.pdb.Spec.MinAvailable.String() != want):
			t.Errorf("%q: budget %+v, want minAvailable %s", values, m.pdb, want)
		}
	}
	if _, err := render(t, minimal+"podDisruptionBudget: {minAvailable: 2}"); err == nil || !strings.Contains(err.Error(), "no pod could ever be evicted") {
		t.Errorf("minAvailable 2 of 2 replicas: %v", err)
	}
}

// Both pods run as nobody, group nogroup (65534, as the images' USER 65534:65534), not root,
// with no privilege, no capability and a read-only root file system.
func TestChartSecurityContext(t *testing.T) {
	m, err := render(t, everyOption)
	if err != nil {
		t.Fatal(err)
	}
	for name, pod := range map[string]corev1.PodSpec{"service": m.deployment.Spec.Template.Spec, "job": m.job.Spec.Template.Spec} {
		sc := pod.SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65534 || sc.RunAsGroup == nil || *sc.RunAsGroup != 65534 ||
			sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod security context %+v", name, sc)
			continue
		}
		for _, c := range pod.Containers {
			cs := c.SecurityContext
			if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem ||
				cs.Capabilities == nil || len(cs.Capabilities.Drop) != 1 || cs.Capabilities.Drop[0] != "ALL" || len(cs.Capabilities.Add) != 0 {
				t.Errorf("%s: container %s security context %+v", name, c.Name, cs)
			}
		}
	}
}

// The pods' rlfn.dev/config annotation is the checksum of the chart's files: another file
// rolls the pods at helm upgrade. With an existing ConfigMap (reloaded in place) or xDS there
// are no files of the chart's, and no annotation.
func TestChartConfigChecksum(t *testing.T) {
	sum := func(values string) (string, bool) {
		t.Helper()
		m, err := render(t, values)
		if err != nil {
			t.Fatalf("%s: %v", values, err)
		}
		v, ok := m.deployment.Spec.Template.Annotations["rlfn.dev/config"]
		return v, ok
	}
	a, ok := sum(minimal)
	b, _ := sum(minimal + "podAnnotations: {team: edge}")
	c, _ := sum("config: {configMap: {files: {ratelimit.yaml: 'domain: edge'}}}")
	if !ok || len(a) != 16 || a != b || a == c {
		t.Errorf("checksums %q (%v), %q with an annotation, %q with other files", a, ok, b, c)
	}
	for _, values := range []string{"config: {configMap: {existing: limits}}", everyOption} {
		if v, ok := sum(values); ok {
			t.Errorf("%s: rlfn.dev/config %q", values, v)
		}
	}
	m, err := render(t, "config: {configMap: {existing: limits}}")
	if err != nil {
		t.Fatal(err)
	}
	if m.configMap != nil || m.deployment.Spec.Template.Spec.Volumes[0].ConfigMap.Name != "limits" {
		t.Errorf("existing: ConfigMap %v, volume %+v", m.configMap, m.deployment.Spec.Template.Spec.Volumes[0])
	}
}

// Shutdown: the pod sleeps (the kubelet's sleep action: the image has no sleep) before its
// SIGTERM closes the listeners, so that the endpoints drop it first; the grace period covers
// the sleep and the drain; the chart asks for the Kubernetes that has the action.
func TestChartShutdown(t *testing.T) {
	m, err := render(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	pod := m.deployment.Spec.Template.Spec
	l := pod.Containers[0].Lifecycle
	if l == nil || l.PreStop == nil || l.PreStop.Sleep == nil || l.PreStop.Sleep.Seconds != 5 || l.PreStop.Exec != nil || *pod.TerminationGracePeriodSeconds != 25 {
		t.Errorf("lifecycle %+v, grace %d", l, *pod.TerminationGracePeriodSeconds)
	}
	m, err = render(t, minimal+"preStopSleepSeconds: 10\nterminationGracePeriodSeconds: 40")
	if err != nil {
		t.Fatal(err)
	}
	pod = m.deployment.Spec.Template.Spec
	if l := pod.Containers[0].Lifecycle; l == nil || l.PreStop == nil || l.PreStop.Sleep == nil || l.PreStop.Sleep.Seconds != 10 || *pod.TerminationGracePeriodSeconds != 40 {
		t.Errorf("lifecycle %+v, grace %d", pod.Containers[0].Lifecycle, *pod.TerminationGracePeriodSeconds)
	}
	m, err = render(t, minimal+"preStopSleepSeconds: 0")
	if err != nil {
		t.Fatal(err)
	}
	if l := m.deployment.Spec.Template.Spec.Containers[0].Lifecycle; l != nil {
		t.Errorf("preStopSleepSeconds 0: lifecycle %+v", l)
	}
	if _, err := render(t, minimal+"preStopSleepSeconds: 30"); err == nil || !strings.Contains(err.Error(), "must exceed preStopSleepSeconds") {
		t.Errorf("a sleep as long as the grace period: %v", err)
	}
	chrt, err := loader.Load("rlfn-rls")
	if err != nil {
		t.Fatal(err)
	}
	if !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, "v1.30.0") || chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, "v1.29.9") {
		t.Errorf("kubeVersion %s: 1.30 has the sleep action, 1.29 has it off", chrt.Metadata.KubeVersion)
	}
}

// rlfn deploy's exit 4 (deployed, with a warning not accepted) fails the Job at once: a
// retry would only say it again, three times over. A disruption is not counted; other
// failures (a server unreachable a moment) are retried.
func TestChartJobFailurePolicy(t *testing.T) {
	m, err := render(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	p := m.job.Spec.PodFailurePolicy
	if p == nil || len(p.Rules) != 2 || *m.job.Spec.BackoffLimit != 3 {
		t.Fatalf("podFailurePolicy %+v, backoffLimit %d", p, *m.job.Spec.BackoffLimit)
	}
	exit, disrupted := p.Rules[0], p.Rules[1]
	if exit.Action != batchv1.PodFailurePolicyActionFailJob || exit.OnExitCodes == nil || *exit.OnExitCodes.ContainerName != m.job.Spec.Template.Spec.Containers[0].Name ||
		exit.OnExitCodes.Operator != batchv1.PodFailurePolicyOnExitCodesOpIn || len(exit.OnExitCodes.Values) != 1 || exit.OnExitCodes.Values[0] != 4 {
		t.Errorf("exit codes rule %+v", exit)
	}
	if disrupted.Action != batchv1.PodFailurePolicyActionIgnore || len(disrupted.OnPodConditions) != 1 || disrupted.OnPodConditions[0].Type != corev1.DisruptionTarget {
		t.Errorf("disruption rule %+v", disrupted)
	}
	// The Job controller takes a podFailurePolicy only with restartPolicy Never.
	if m.job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %s", m.job.Spec.Template.Spec.RestartPolicy)
	}
}

// The URL in the values, when given there (a server without a password), is both pods'.
func TestChartURL(t *testing.T) {
	m, err := render(t, minimal+"url: rediss://valkey.cache.svc:6380")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]corev1.Container{"service": m.deployment.Spec.Template.Spec.Containers[0], "job": m.job.Spec.Template.Spec.Containers[0]} {
		if len(c.Env) != 1 || c.Env[0].Name != "RLFN_URL" || c.Env[0].Value != "rediss://valkey.cache.svc:6380" || c.Env[0].ValueFrom != nil {
			t.Errorf("%s: env %+v", name, c.Env)
		}
	}
}
