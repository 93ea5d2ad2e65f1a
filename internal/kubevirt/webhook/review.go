package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// maxReview bounds an AdmissionReview body (the API server sends at most a
// few MiB).
const maxReview = 8 << 20

// Kinds the webhook mutates.
const (
	KindVM  = "VirtualMachine"
	KindVMI = "VirtualMachineInstance"
)

// ServeHTTP answers one AdmissionReview (admission.k8s.io/v1). A body that
// is not one is 400; an object the webhook cannot read, or must refuse, is
// an AdmissionResponse with allowed false and a message naming the cause.
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReview+1))
	if err != nil || len(body) > maxReview {
		http.Error(rw, "AdmissionReview: unreadable or larger than 8 MiB", http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		http.Error(rw, fmt.Sprintf("AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	if review.Request == nil || review.Request.UID == "" {
		http.Error(rw, "AdmissionReview: no request, or a request without uid", http.StatusBadRequest)
		return
	}
	resp := w.Review(r.Context(), review.Request)
	out := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Response: resp}
	rw.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(rw).Encode(out); err != nil {
		w.cfg.Logger.Warn("admission response not sent", "err", err)
	}
}

// Review decides one admission request.
func (w *Webhook) Review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return resp
	}
	if req.Kind.Kind == KindVMI && req.Operation != admissionv1.Create {
		// A VMI's disks are fixed once it runs: they are looked up when it
		// is created, at every start of its VM, and never again.
		return resp
	}
	patch, warnings, err := w.mutate(ctx, req)
	log := w.cfg.Logger.With("kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name)
	resp.Warnings = warnings
	if err != nil {
		code := int32(http.StatusBadRequest)
		if errors.Is(err, ErrLookup) {
			code = http.StatusInternalServerError
		}
		log.Warn("admission refused", "err", err)
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: "quiver: " + err.Error(),
			Reason: metav1.StatusReasonBadRequest}
		if code == http.StatusInternalServerError {
			resp.Result.Reason = metav1.StatusReasonInternalError
		}
		return resp
	}
	if patch != nil {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
		log.Info("admission mutated", "patch", string(patch))
	}
	return resp
}

// object is the subset of a VirtualMachine or a VirtualMachineInstance the
// webhook reads.
type object struct {
	Metadata kubevirt.ObjectMeta `json:"metadata"`
	Spec     struct {
		Volumes  []kubevirt.Volume `json:"volumes"` // VMI
		Template *struct {
			Metadata *kubevirt.ObjectMeta `json:"metadata"`
			Spec     struct {
				Volumes []kubevirt.Volume `json:"volumes"`
			} `json:"spec"`
		} `json:"template"` // VM
	} `json:"spec"`
}

// patchOp is one JSON Patch (RFC 6902) operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// mutate returns the JSON Patch for the request's object (nil: no change).
func (w *Webhook) mutate(ctx context.Context, req *admissionv1.AdmissionRequest) ([]byte, []string, error) {
	if req.Kind.Group != "kubevirt.io" || (req.Kind.Kind != KindVM && req.Kind.Kind != KindVMI) {
		return nil, nil, nil // not ours to look at (a misconfigured rule)
	}
	var obj object
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return nil, nil, fmt.Errorf("%s %s/%s: %v: %w", req.Kind.Kind, req.Namespace, req.Name, err, ErrDenied)
	}
	namespace := req.Namespace
	if namespace == "" {
		namespace = obj.Metadata.Namespace
	}
	var ops []patchOp
	switch req.Kind.Kind {
	case KindVMI:
		out, warnings, err := w.annotate(ctx, namespace, obj.Metadata.Annotations, obj.Spec.Volumes)
		if err != nil || maps.Equal(out, obj.Metadata.Annotations) || (len(out) == 0 && obj.Metadata.Annotations == nil) {
			return nil, warnings, err
		}
		ops = append(ops, setMap("/metadata/annotations", obj.Metadata.Annotations != nil, out))
		return encode(ops, warnings)
	default:
		tpl := obj.Spec.Template
		if tpl == nil {
			return nil, nil, fmt.Errorf("VirtualMachine %s/%s: no spec.template: %w", namespace, req.Name, ErrDenied)
		}
		var current map[string]string
		if tpl.Metadata != nil {
			current = tpl.Metadata.Annotations
		}
		out, warnings, err := w.annotate(ctx, namespace, current, tpl.Spec.Volumes)
		if err != nil || maps.Equal(out, current) || (len(out) == 0 && current == nil) {
			return nil, warnings, err
		}
		if tpl.Metadata == nil {
			ops = append(ops, patchOp{Op: "add", Path: "/spec/template/metadata", Value: map[string]any{"annotations": out}})
		} else {
			ops = append(ops, setMap("/spec/template/metadata/annotations", current != nil, out))
		}
		return encode(ops, warnings)
	}
}

// setMap sets a whole map at path: replace when it exists, else add.
func setMap(path string, exists bool, m map[string]string) patchOp {
	if exists {
		return patchOp{Op: "replace", Path: path, Value: m}
	}
	return patchOp{Op: "add", Path: path, Value: m}
}

func encode(ops []patchOp, warnings []string) ([]byte, []string, error) {
	b, err := json.Marshal(ops)
	return b, warnings, err
}
