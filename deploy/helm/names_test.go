package helm

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// checkNames checks what the API server would refuse, or the controllers break on, of what
// the chart names: every object's name a DNS-1123 label (63 characters at most: a Job's name
// becomes its pods' job-name label, a Service's a DNS label, which also starts with a letter),
// every label and selector valid, each pod's container ports and volumes named validly and
// once, and the Service's ports once each.
func checkNames(t *testing.T, m *manifests) {
	t.Helper()
	errs := func(what string, e []string) {
		if len(e) > 0 {
			t.Errorf("%s: %s", what, strings.Join(e, "; "))
		}
	}
	labels := func(what string, l map[string]string) {
		for k, v := range l {
			errs(fmt.Sprintf("%s label key %q", what, k), validation.IsQualifiedName(k))
			errs(fmt.Sprintf("%s label %s=%q", what, k, v), validation.IsValidLabelValue(v))
		}
	}
	for _, o := range m.objects {
		what := o.Kind + " " + o.Metadata.Name
		errs(what, validation.IsDNS1123Label(o.Metadata.Name))
		if o.Kind == "Service" {
			errs(what, validation.IsDNS1035Label(o.Metadata.Name))
		}
		labels(what, o.Metadata.Labels)
		for k := range o.Metadata.Annotations {
			errs(fmt.Sprintf("%s annotation %q", what, k), validation.IsQualifiedName(k))
		}
	}
	pods := map[string]*corev1.PodTemplateSpec{}
	if m.deployment != nil {
		pods["Deployment"] = &m.deployment.Spec.Template
		labels("Deployment selector", m.deployment.Spec.Selector.MatchLabels)
	}
	if m.job != nil {
		pods["Job"] = &m.job.Spec.Template
	}
	for kind, pod := range pods {
		labels(kind+" pod", pod.Labels)
		volumes := map[string]bool{}
		for _, v := range pod.Spec.Volumes {
			errs(kind+" volume "+v.Name, validation.IsDNS1123Label(v.Name))
			if volumes[v.Name] {
				t.Errorf("%s: volume %s twice", kind, v.Name)
			}
			volumes[v.Name] = true
		}
		names, numbers := map[string]bool{}, map[int32]bool{}
		for _, c := range pod.Spec.Containers {
			for _, p := range c.Ports {
				errs(fmt.Sprintf("%s port name %q", kind, p.Name), validation.IsValidPortName(p.Name))
				if names[p.Name] || numbers[p.ContainerPort] {
					t.Errorf("%s: port %s %d twice in %v", kind, p.Name, p.ContainerPort, c.Ports)
				}
				names[p.Name], numbers[p.ContainerPort] = true, true
			}
			for _, vm := range c.VolumeMounts {
				if !volumes[vm.Name] {
					t.Errorf("%s: mount of %s, no such volume", kind, vm.Name)
				}
			}
		}
	}
	if m.service != nil {
		labels("Service selector", m.service.Spec.Selector)
		names, numbers := map[string]bool{}, map[int32]bool{}
		for _, p := range m.service.Spec.Ports {
			errs(fmt.Sprintf("Service port name %q", p.Name), validation.IsValidPortName(p.Name))
			if names[p.Name] || numbers[p.Port] {
				t.Errorf("Service: port %s %d twice in %v", p.Name, p.Port, m.service.Spec.Ports)
			}
			names[p.Name], numbers[p.Port] = true, true
		}
	}
}

// Every name the chart gives is valid with the longest release names Helm takes (53
// characters) as with short ones, with every object rendered: the deploy Job's name,
// RELEASE-rlfn-rls-deploy, is cut to 63 characters, keeping its -deploy.
func TestChartNames(t *testing.T) {
	long50 := strings.Repeat("a", 45) + "-edge"
	long53 := strings.Repeat("b", 48) + "-edge"
	for _, release := range []string{"edge", long50, long53} {
		for name, values := range map[string]string{"defaults": minimal, "every option": everyOption, "production": minimal + production} {
			t.Run(fmt.Sprintf("%d/%s", len(release), name), func(t *testing.T) {
				m, err := renderRelease(t, release, values)
				if err != nil {
					t.Fatal(err)
				}
				checkNames(t, m)
				if m.job != nil && !strings.HasSuffix(m.job.Name, "-deploy") {
					t.Errorf("the Job's name %s", m.job.Name)
				}
			})
		}
	}
	// Names the Service could not take are refused at rendering.
	for _, release := range []string{"1edge", "edge.v1"} {
		if _, err := renderRelease(t, release, minimal); err == nil || !strings.Contains(err.Error(), "must start with a letter") {
			t.Errorf("release %s: %v", release, err)
		}
	}
}
