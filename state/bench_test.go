package state

import (
	"fmt"
	"testing"
)

// deployment builds a Deployment-like object of about 5 KB, as decoded by client-go.
func deployment(replicas int64, image string) map[string]any {
	containers := make([]any, 0, 4)
	for i := range 4 {
		env := make([]any, 0, 10)
		for j := range 10 {
			env = append(env, map[string]any{"name": fmt.Sprintf("VAR_%d_%d", i, j), "value": fmt.Sprintf("value-%d-%d", i, j)})
		}
		containers = append(containers, map[string]any{
			"name":  fmt.Sprintf("c%d", i),
			"image": image,
			"args":  []any{"--port=8080", "--verbose", "--config=/etc/app/config.yaml"},
			"env":   env,
			"ports": []any{map[string]any{"containerPort": int64(8080 + i), "protocol": "TCP", "name": "http"}},
			"resources": map[string]any{
				"limits":   map[string]any{"cpu": "500m", "memory": "512Mi"},
				"requests": map[string]any{"cpu": "100m", "memory": "128Mi"},
			},
			"readinessProbe": map[string]any{
				"httpGet":             map[string]any{"path": "/healthz", "port": int64(8080)},
				"initialDelaySeconds": int64(5), "periodSeconds": int64(10), "failureThreshold": int64(3),
			},
			"volumeMounts": []any{map[string]any{"name": "config", "mountPath": "/etc/app"}},
		})
	}
	return map[string]any{
		"apiVersion": "apps/v1",
		"kind":       "Deployment",
		"metadata": map[string]any{
			"name": "web", "namespace": "default", "uid": "8d8a7c4e-4c1a-4b8e-9a55-0d3b6f0f2e11",
			"resourceVersion": "123456", "generation": int64(7), "creationTimestamp": "2025-01-01T00:00:00Z",
			"labels": map[string]any{"app": "web", "tier": "frontend", "team": "platform"},
			"annotations": map[string]any{
				"deployment.kubernetes.io/revision":                "7",
				"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"}}`,
				testPrefix + "/last-handled-configuration":         `{"spec":{}}`,
				testPrefix + "/create_fn":                          `{"started":"2025-01-01T00:00:00Z","success":true}`,
			},
			"managedFields": []any{map[string]any{"manager": "kubectl", "operation": "Update", "apiVersion": "apps/v1"}},
		},
		"spec": map[string]any{
			"replicas":             replicas,
			"revisionHistoryLimit": int64(10),
			"selector":             map[string]any{"matchLabels": map[string]any{"app": "web"}},
			"strategy": map[string]any{"type": "RollingUpdate",
				"rollingUpdate": map[string]any{"maxSurge": "25%", "maxUnavailable": "25%"}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": "web", "tier": "frontend"}},
				"spec": map[string]any{
					"containers":                    containers,
					"volumes":                       []any{map[string]any{"name": "config", "configMap": map[string]any{"name": "web-config"}}},
					"restartPolicy":                 "Always",
					"terminationGracePeriodSeconds": int64(30),
					"dnsPolicy":                     "ClusterFirst",
				},
			},
		},
		"status": map[string]any{
			"replicas": replicas, "readyReplicas": replicas, "observedGeneration": int64(7),
			"conditions": []any{map[string]any{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}},
		},
	}
}

func TestBenchObjectSize(t *testing.T) {
	s := mustJSON(t, deployment(3, "nginx:1.27"))
	if len(s) < 4000 || len(s) > 7000 {
		t.Fatalf("benchmark object is %d bytes, meant to be about 5 KB", len(s))
	}
}

func BenchmarkEssenceEncode(b *testing.B) {
	o := deployment(3, "nginx:1.27")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := EncodeEssence(Essence(o, testPrefix)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEssence(b *testing.B) {
	o := deployment(3, "nginx:1.27")
	b.ReportAllocs()
	for b.Loop() {
		Essence(o, testPrefix)
	}
}

func BenchmarkCompareEqual(b *testing.B) {
	old, new := Essence(deployment(3, "nginx:1.27"), testPrefix), Essence(deployment(3, "nginx:1.27"), testPrefix)
	b.ReportAllocs()
	for b.Loop() {
		if d := Compare(old, new); len(d) != 0 {
			b.Fatal(d)
		}
	}
}

func BenchmarkCompareChanged(b *testing.B) {
	old, new := Essence(deployment(3, "nginx:1.27"), testPrefix), Essence(deployment(5, "nginx:1.28"), testPrefix)
	b.ReportAllocs()
	for b.Loop() {
		if d := Compare(old, new); len(d) != 2 { // replicas, and the containers list as one atom
			b.Fatal(len(d))
		}
	}
}
