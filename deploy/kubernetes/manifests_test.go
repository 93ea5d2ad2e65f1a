package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/quiverstorage/quiver/internal/csi"
	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// kinds maps apiVersion/kind to a new typed object. KubeVirt's and CDI's Go
// API modules are not available to this build (the module proxy refuses
// kubevirt.io/api and kubevirt.io/containerized-data-importer-api), so
// VirtualMachine and DataVolume decode into the subset types below, which
// mirror the upstream field names for every field the examples use;
// unknown fields are errors there too.
var kinds = map[string]func() any{
	"v1/Namespace":             func() any { return &corev1.Namespace{} },
	"v1/Secret":                func() any { return &corev1.Secret{} },
	"v1/ServiceAccount":        func() any { return &corev1.ServiceAccount{} },
	"v1/Service":               func() any { return &corev1.Service{} },
	"v1/PersistentVolumeClaim": func() any { return &corev1.PersistentVolumeClaim{} },
	"admissionregistration.k8s.io/v1/MutatingWebhookConfiguration": func() any {
		return &admissionregistrationv1.MutatingWebhookConfiguration{}
	},
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"rbac.authorization.k8s.io/v1/Role":               func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding":        func() any { return &rbacv1.RoleBinding{} },
	"apps/v1/Deployment":                              func() any { return &appsv1.Deployment{} },
	"apps/v1/DaemonSet":                               func() any { return &appsv1.DaemonSet{} },
	"storage.k8s.io/v1/CSIDriver":                     func() any { return &storagev1.CSIDriver{} },
	"storage.k8s.io/v1/StorageClass":                  func() any { return &storagev1.StorageClass{} },
	"snapshot.storage.k8s.io/v1/VolumeSnapshotClass":  func() any { return &snapv1.VolumeSnapshotClass{} },
	"apps/v1/StatefulSet":                             func() any { return &appsv1.StatefulSet{} },
	"cert-manager.io/v1/Issuer":                       func() any { return &cmIssuer{} },
	"cert-manager.io/v1/Certificate":                  func() any { return &cmCertificate{} },
	"kubevirt.io/v1/VirtualMachine":                   func() any { return &virtualMachine{} },
	"cdi.kubevirt.io/v1beta1/DataVolume":              func() any { return &dataVolume{} },
}

// object is one decoded manifest.
type object struct {
	file string
	kind string
	obj  any
}

// decodeAll decodes every document of every YAML file here, strictly:
// duplicate keys, unknown fields, unknown kinds and values of the wrong type
// are errors.
func decodeAll(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var out []object
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decodeStream(t, file, data)...)
	}
	return out
}

// decodeStream decodes every document of a YAML stream (a file, or what
// helm template prints), strictly; file names it in errors.
func decodeStream(t *testing.T, file string, data []byte) []object {
	t.Helper()
	var out []object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		o, err := decode(doc)
		if err != nil {
			t.Errorf("%s document %d: %v", file, i+1, err)
			continue
		}
		o.file = file
		out = append(out, o)
	}
	return out
}

func decode(doc []byte) (object, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return object{}, err
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return object{}, err
	}
	kind := tm.APIVersion + "/" + tm.Kind
	mk, ok := kinds[kind]
	if !ok {
		return object{}, fmt.Errorf("unknown kind %s", kind)
	}
	obj := mk()
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(obj); err != nil {
		return object{}, fmt.Errorf("%s: %w", kind, err)
	}
	return object{kind: kind, obj: obj}, nil
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for line := range bytes.SplitSeq(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// chartOnly are the kinds only the Helm chart makes: the storage node and
// cert-manager's objects.
var chartOnly = map[string]bool{
	"apps/v1/StatefulSet":            true,
	"cert-manager.io/v1/Issuer":      true,
	"cert-manager.io/v1/Certificate": true,
}

func TestManifestsDecodeStrictly(t *testing.T) {
	objs := decodeAll(t)
	var seen []string
	for _, o := range objs {
		seen = append(seen, o.kind)
	}
	for kind := range kinds {
		if !slices.Contains(seen, kind) && !chartOnly[kind] {
			t.Errorf("no manifest of kind %s", kind)
		}
	}
}

// TestStrictDecodingRefuses checks the checker: a misspelt field, a wrong
// type, a duplicate key and an unknown kind all fail.
func TestStrictDecodingRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":   "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: x}\nprovisioner: csi.quiver.io\nvolumeBindingMod: Immediate\n",
		"wrong type":      "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: x}\nprovisioner: csi.quiver.io\nallowVolumeExpansion: yes-please\n",
		"duplicate key":   "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: x}\nprovisioner: a\nprovisioner: b\n",
		"unknown kind":    "apiVersion: storage.k8s.io/v1\nkind: StorageKlass\nmetadata: {name: x}\n",
		"VM unknown":      "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: x}\nspec: {running: true, runStrategi: Always}\n",
		"bad quantity":    "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: x}\nspec: {storage: {resources: {requests: {storage: lots}}}}\n",
		"deployment typo": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: a, imagee: b}]}}}\n",
	} {
		if _, err := decode([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// TestManifestsAgree checks what ties the manifests to the plugin (checkAgree)
// and the examples' DataVolumes and VMs to the classes.
func TestManifestsAgree(t *testing.T) {
	objs := decodeAll(t)
	classes := checkAgree(t, objs)
	mig := classes["quiver-vm-migratable"]
	if mig == nil {
		t.Fatal("no class quiver-vm-migratable")
	}
	checkExamples(t, objs, classes, mig)
}

// checkAgree checks what ties a set of objects (the manifests, or the Helm
// chart's) to the plugin: the driver name, StorageClass parameters the
// plugin accepts, the two classes' binding modes, the sidecars, and the
// node plugin's and endpoint's shared paths. It returns the classes.
func checkAgree(t *testing.T, objs []object) map[string]*storagev1.StorageClass {
	t.Helper()
	classes := map[string]*storagev1.StorageClass{}
	containers := map[string]bool{}
	flags := map[string]string{} // "<container> --flag" -> value
	for _, o := range objs {
		switch obj := o.obj.(type) {
		case *storagev1.CSIDriver:
			if obj.Name != csi.DefaultDriverName || obj.Spec.AttachRequired == nil || !*obj.Spec.AttachRequired {
				t.Errorf("CSIDriver %s: want name %s with attachRequired", obj.Name, csi.DefaultDriverName)
			}
		case *storagev1.StorageClass:
			classes[obj.Name] = obj
			if obj.Provisioner != csi.DefaultDriverName {
				t.Errorf("StorageClass %s: provisioner %s", obj.Name, obj.Provisioner)
			}
			if err := csi.CheckParameters(obj.Parameters); err != nil {
				t.Errorf("StorageClass %s: %v", obj.Name, err)
			}
		case *snapv1.VolumeSnapshotClass:
			if obj.Driver != csi.DefaultDriverName {
				t.Errorf("VolumeSnapshotClass %s: driver %s", obj.Name, obj.Driver)
			}
		case *appsv1.Deployment:
			for _, c := range obj.Spec.Template.Spec.Containers {
				containers[c.Name] = true
			}
		case *appsv1.DaemonSet:
			for _, c := range obj.Spec.Template.Spec.Containers {
				containers[c.Name] = true
				if c.Name == "quiver-csi" {
					checkRegistration(t, obj.Spec.Template.Spec, c)
				}
				if c.Name == "quiver-csi" || c.Name == "endpoint" {
					for _, a := range c.Args {
						if k, v, ok := strings.Cut(a, "="); ok {
							flags[c.Name+" "+k] = v
						}
					}
				}
			}
		}
	}
	for _, c := range []string{"quiver-csi", "csi-provisioner", "csi-attacher", "csi-snapshotter", "csi-resizer",
		"liveness-probe", "endpoint"} {
		if !containers[c] {
			t.Errorf("no container %s", c)
		}
	}
	// The node plugin asks the endpoint on its control socket, and the
	// endpoint makes FUSE mounts only under the plugin's state directory.
	if sock := flags["quiver-csi --quiver-endpoint"]; sock == "" || sock != flags["endpoint --control"] {
		t.Errorf("node plugin --quiver-endpoint %q and endpoint --control %q differ", sock, flags["endpoint --control"])
	}
	if root, state := flags["endpoint --fuse-root"], flags["quiver-csi --state-dir"]; root != state+"/fuse" {
		t.Errorf("endpoint --fuse-root %q is not the node plugin's --state-dir %q + /fuse", root, state)
	}
	if flags["endpoint --root"] == "" || flags["endpoint --servers"] == "" {
		t.Errorf("endpoint: --root %q, --servers %q: want both", flags["endpoint --root"], flags["endpoint --servers"])
	}
	mig, ten := classes["quiver-vm-migratable"], classes["quiver-tenant"]
	if mig == nil || ten == nil {
		t.Fatalf("want StorageClasses quiver-vm-migratable and quiver-tenant, have %v", classes)
	}
	if mig.VolumeBindingMode == nil || *mig.VolumeBindingMode != storagev1.VolumeBindingImmediate || mig.Parameters["replication"] != "1" ||
		mig.Parameters["qos_rw_iops"] == "" {
		t.Errorf("quiver-vm-migratable: want Immediate binding, replication 1 and QoS, have %+v", mig)
	}
	if ten.VolumeBindingMode == nil || *ten.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		t.Errorf("quiver-tenant: want WaitForFirstConsumer")
	}
	return classes
}

// checkExamples: the example VMs' and DataVolumes' claims are on the
// classes, as the webhook would annotate them.
func checkExamples(t *testing.T, objs []object, classes map[string]*storagev1.StorageClass, mig *storagev1.StorageClass) {
	t.Helper()
	claims := map[string]*corev1.PersistentVolumeClaim{}
	for _, o := range objs {
		if pvc, ok := o.obj.(*corev1.PersistentVolumeClaim); ok {
			claims[pvc.Name] = pvc
		}
	}
	for _, o := range objs {
		switch obj := o.obj.(type) {
		case *virtualMachine:
			checkExtraDisks(t, obj, claims, classes)
			for _, dv := range obj.Spec.DataVolumeTemplates {
				s := dv.Spec.Storage
				if s == nil || s.StorageClassName == nil || *s.StorageClassName != mig.Name ||
					!slices.Contains(s.AccessModes, corev1.ReadWriteMany) || s.VolumeMode == nil || *s.VolumeMode != corev1.PersistentVolumeBlock {
					t.Errorf("VM %s: DataVolume %s should be RWX Block on %s", obj.Name, dv.Name, mig.Name)
				}
			}
		case *dataVolume:
			if s := obj.Spec.Storage; s == nil || s.StorageClassName == nil || !strings.HasPrefix(*s.StorageClassName, "quiver-") {
				t.Errorf("DataVolume %s: not on a quiver class", obj.Name)
			}
		}
	}
}

// checkExtraDisks: a VM's quiver.io/extra-disks annotation names, for each
// PVC volume on a class with a disks parameter, that class's disks other
// than "disk", as the webhook would.
func checkExtraDisks(t *testing.T, vm *virtualMachine, claims map[string]*corev1.PersistentVolumeClaim, classes map[string]*storagev1.StorageClass) {
	t.Helper()
	value, ok := vm.Spec.Template.Annotations[kubevirt.AnnotationExtraDisks]
	if !ok {
		return
	}
	extra, err := kubevirt.ParseExtraDisks(value)
	if err != nil {
		t.Errorf("VM %s: %v", vm.Name, err)
		return
	}
	want := kubevirt.ExtraDisks{}
	for _, v := range vm.Spec.Template.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		pvc := claims[v.PersistentVolumeClaim.ClaimName]
		if pvc == nil || pvc.Spec.StorageClassName == nil || classes[*pvc.Spec.StorageClassName] == nil {
			t.Errorf("VM %s: volume %s: no PVC on a quiver class here", vm.Name, v.Name)
			continue
		}
		if pvc.Spec.VolumeMode == nil || *pvc.Spec.VolumeMode != corev1.PersistentVolumeFilesystem {
			t.Errorf("VM %s: PVC %s: extra disks need volumeMode Filesystem", vm.Name, pvc.Name)
		}
		for item := range strings.SplitSeq(classes[*pvc.Spec.StorageClassName].Parameters[csi.ParamDisks], ",") {
			if name, _, _ := strings.Cut(item, "="); name != kubevirt.PrimaryDisk && name != "" {
				want[v.Name] = append(want[v.Name], name)
			}
		}
	}
	if extra.Format() != want.Format() {
		t.Errorf("VM %s: annotation %s = %s, want %s (from the StorageClass)", vm.Name, kubevirt.AnnotationExtraDisks, extra.Format(), want.Format())
	}
}

// The subset of kubevirt.io/api/core/v1 and CDI v1beta1 the examples use,
// with the upstream JSON names.
type virtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Running             *bool                `json:"running,omitempty"`
		RunStrategy         string               `json:"runStrategy,omitempty"`
		DataVolumeTemplates []dataVolumeTemplate `json:"dataVolumeTemplates,omitempty"`
		Template            struct {
			metav1.ObjectMeta `json:"metadata"`
			Spec              vmiSpec `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

type dataVolumeTemplate struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              dataVolumeSpec `json:"spec"`
}

type vmiSpec struct {
	EvictionStrategy string `json:"evictionStrategy,omitempty"`
	Domain           struct {
		CPU *struct {
			Cores uint32 `json:"cores,omitempty"`
		} `json:"cpu,omitempty"`
		Memory *struct {
			Guest *resource.Quantity `json:"guest,omitempty"`
		} `json:"memory,omitempty"`
		Devices struct {
			Disks []struct {
				Name string `json:"name"`
				Disk *struct {
					Bus string `json:"bus,omitempty"`
				} `json:"disk,omitempty"`
			} `json:"disks,omitempty"`
			Interfaces []struct {
				Name       string    `json:"name"`
				Masquerade *struct{} `json:"masquerade,omitempty"`
				Bridge     *struct{} `json:"bridge,omitempty"`
			} `json:"interfaces,omitempty"`
		} `json:"devices"`
	} `json:"domain"`
	Networks []struct {
		Name string    `json:"name"`
		Pod  *struct{} `json:"pod,omitempty"`
	} `json:"networks,omitempty"`
	Volumes []struct {
		Name       string `json:"name"`
		DataVolume *struct {
			Name string `json:"name"`
		} `json:"dataVolume,omitempty"`
		PersistentVolumeClaim *corev1.PersistentVolumeClaimVolumeSource `json:"persistentVolumeClaim,omitempty"`
		CloudInitNoCloud      *struct {
			UserData string `json:"userData,omitempty"`
		} `json:"cloudInitNoCloud,omitempty"`
	} `json:"volumes,omitempty"`
}

type dataVolume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              dataVolumeSpec `json:"spec"`
}

type dataVolumeSpec struct {
	Source *struct {
		HTTP *struct {
			URL string `json:"url"`
		} `json:"http,omitempty"`
		Blank    *struct{} `json:"blank,omitempty"`
		Registry *struct {
			URL *string `json:"url,omitempty"`
		} `json:"registry,omitempty"`
	} `json:"source,omitempty"`
	Storage *struct {
		AccessModes      []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`
		VolumeMode       *corev1.PersistentVolumeMode        `json:"volumeMode,omitempty"`
		Resources        corev1.VolumeResourceRequirements   `json:"resources,omitempty"`
		StorageClassName *string                             `json:"storageClassName,omitempty"`
	} `json:"storage,omitempty"`
}

// The subset of cert-manager.io/v1 Issuer and Certificate the chart writes,
// with the upstream JSON names.
type cmIssuer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SelfSigned *struct{} `json:"selfSigned,omitempty"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
}

type cmCertificate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		IsCA       bool     `json:"isCA,omitempty"`
		CommonName string   `json:"commonName,omitempty"`
		SecretName string   `json:"secretName"`
		Duration   string   `json:"duration,omitempty"`
		DNSNames   []string `json:"dnsNames,omitempty"`
		PrivateKey *struct {
			Algorithm string `json:"algorithm,omitempty"`
			Size      int    `json:"size,omitempty"`
		} `json:"privateKey,omitempty"`
		IssuerRef struct {
			Name  string `json:"name"`
			Kind  string `json:"kind,omitempty"`
			Group string `json:"group,omitempty"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// checkRegistration: the node plugin registers itself with the kubelet
// (internal/pluginreg): --registration-dir is where the host's
// <kubelet>/plugins_registry is mounted, and --kubelet-endpoint is the host
// path of the socket that --endpoint serves in the container.
func checkRegistration(t *testing.T, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	flags := map[string]string{}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(a, "="); ok {
			flags[k] = v
		}
	}
	// hostPathAt is the host directory mounted at dir in the container.
	hostPathAt := func(dir string) string {
		for _, m := range c.VolumeMounts {
			if m.MountPath != dir {
				continue
			}
			for _, v := range pod.Volumes {
				if v.Name == m.Name && v.HostPath != nil {
					return v.HostPath.Path
				}
			}
		}
		return ""
	}
	reg := hostPathAt(flags["--registration-dir"])
	if flags["--registration-dir"] == "" || !strings.HasSuffix(reg, "/plugins_registry") {
		t.Errorf("node plugin: --registration-dir %q is not the host's kubelet plugins_registry (mounted from %q)",
			flags["--registration-dir"], reg)
	}
	sock := strings.TrimPrefix(flags["--endpoint"], "unix://")
	host := hostPathAt(path.Dir(sock))
	if host == "" || flags["--kubelet-endpoint"] != host+"/"+path.Base(sock) {
		t.Errorf("node plugin: --kubelet-endpoint %q, want the host path of --endpoint %q: %q/%s",
			flags["--kubelet-endpoint"], flags["--endpoint"], host, path.Base(sock))
	}
	if kubelet := strings.TrimSuffix(reg, "/plugins_registry"); !strings.HasPrefix(host, kubelet+"/plugins/") {
		t.Errorf("node plugin: its socket %q is not under the kubelet's plugins directory %q", host, kubelet+"/plugins/")
	}
}
