// Command go-webhook is the Go peer of safe-termination's admission webhook for the load test
// (bench/webhook-load.sh, docs/benchmarks/webhook.md "Load over TLS on loopback"): a controller-runtime
// webhook server (TLS, HTTP/2 and HTTP/1.1) whose handler does the same mutation as
// src/webhook/mutate.rs with a static plan of a 10 s native preStop sleep: decode the Pod,
// add lifecycle.preStop.sleep to every container without a preStop hook, raise
// terminationGracePeriodSeconds to max(current or 30, min(preStop + 30, 600), preStop), set the
// safetermination.io/prestop-seconds and safetermination.io/policy annotations, and answer with
// the JSON patch controller-runtime computes between the original and the mutated Pod
// (admission.PatchResponseFromRaw, the usual controller-runtime pattern). One log line per
// review (logr/zap JSON at info, unsampled); controller-runtime's webhook metrics are
// counted by the server.
//
// Usage: go-webhook -listen 127.0.0.1:18445 -cert-dir DIR (DIR/tls.crt, DIR/tls.key) [-pre-stop-seconds 10]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"net"
	"net/http"
	"os"
	"strconv"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	annotationPreStopSeconds = "safetermination.io/prestop-seconds"
	annotationPolicy         = "safetermination.io/policy"
	annotationSkip           = "safetermination.io/skip"
	kubernetesDefaultGrace   = int64(30)
	appShutdownSeconds       = int64(30)
	graceMaxSeconds          = int64(600)
)

type mutator struct {
	decoder        admission.Decoder
	preStopSeconds int64
	policy         string
}

func (m *mutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	log := ctrl.LoggerFrom(ctx)
	if req.Operation != "CREATE" || req.Kind.Kind != "Pod" || req.SubResource != "" {
		return admission.Allowed("ignored")
	}
	pod := &corev1.Pod{}
	if err := m.decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Annotations[annotationSkip] == "true" || pod.Spec.RestartPolicy == corev1.RestartPolicyNever || pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure {
		log.Info("admission review", "uid", req.UID, "namespace", req.Namespace, "pod", pod.Name, "decision", "skipped")
		return admission.Allowed("skipped")
	}
	injected := 0
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			continue
		}
		if c.Lifecycle == nil {
			c.Lifecycle = &corev1.Lifecycle{}
		}
		c.Lifecycle.PreStop = &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: m.preStopSeconds}}
		injected++
	}
	current := kubernetesDefaultGrace
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		current = *pod.Spec.TerminationGracePeriodSeconds
	}
	wanted := max(min(m.preStopSeconds+appShutdownSeconds, graceMaxSeconds), m.preStopSeconds)
	if wanted > current {
		pod.Spec.TerminationGracePeriodSeconds = &wanted
	}
	if injected > 0 {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[annotationPreStopSeconds] = strconv.FormatInt(m.preStopSeconds, 10)
		pod.Annotations[annotationPolicy] = m.policy
	}
	mutated, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, mutated)
	log.Info("admission review", "uid", req.UID, "namespace", req.Namespace, "pod", pod.Name, "decision", "mutated", "patchOps", len(resp.Patches))
	return resp
}

func main() {
	listen := flag.String("listen", "127.0.0.1:18445", "HTTPS address")
	certDir := flag.String("cert-dir", ".", "directory holding tls.crt and tls.key")
	preStop := flag.Int64("pre-stop-seconds", 10, "preStop sleep, seconds")
	flag.Parse()
	// JSON lines at info, one per review: development mode turns off the production sampler
	// (which keeps 1 in 100 repeated lines after the first 100 a second)
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.JSONEncoder(), zap.Level(zapcore.InfoLevel), zap.WriteTo(os.Stderr)))

	host, portText, err := net.SplitHostPort(*listen)
	if err != nil {
		panic(err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		panic(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		panic(err)
	}
	server := webhook.NewServer(webhook.Options{Host: host, Port: port, CertDir: *certDir})
	server.Register("/mutate", &admission.Webhook{Handler: &mutator{decoder: admission.NewDecoder(scheme), preStopSeconds: *preStop, policy: "static"}})
	if err := server.Start(ctrl.SetupSignalHandler()); err != nil {
		ctrl.Log.Error(err, "webhook server stopped")
		os.Exit(1)
	}
}
