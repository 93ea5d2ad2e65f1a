package csi

import (
	"context"

	"google.golang.org/protobuf/types/known/wrapperspb"

	addonsid "github.com/quiverstorage/quiver/internal/csiaddons/identity"
)

// addonsIdentity is the csi-addons Identity service: the csi-addons
// sidecar asks it which csi-addons services the plugin's socket serves.
type addonsIdentity struct {
	addonsid.UnimplementedIdentityServer
	d *Driver
}

func (i *addonsIdentity) GetIdentity(context.Context, *addonsid.GetIdentityRequest) (*addonsid.GetIdentityResponse, error) {
	return &addonsid.GetIdentityResponse{Name: i.d.cfg.DriverName, VendorVersion: i.d.cfg.Version}, nil
}

// GetCapabilities advertises the CSI services this process runs and, in
// controller and all modes, the Replication service.
func (i *addonsIdentity) GetCapabilities(context.Context, *addonsid.GetCapabilitiesRequest) (*addonsid.GetCapabilitiesResponse, error) {
	service := func(t addonsid.Capability_Service_Type) *addonsid.Capability {
		return &addonsid.Capability{Type: &addonsid.Capability_Service_{Service: &addonsid.Capability_Service{Type: t}}}
	}
	var caps []*addonsid.Capability
	if i.d.cfg.Mode.controller() {
		caps = append(caps, service(addonsid.Capability_Service_CONTROLLER_SERVICE),
			&addonsid.Capability{Type: &addonsid.Capability_VolumeReplication_{VolumeReplication: &addonsid.Capability_VolumeReplication{
				Type: addonsid.Capability_VolumeReplication_VOLUME_REPLICATION,
			}}})
	}
	if i.d.cfg.Mode.node() {
		caps = append(caps, service(addonsid.Capability_Service_NODE_SERVICE))
	}
	return &addonsid.GetCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe answers ready once the plugin serves, as the CSI identity's does.
func (i *addonsIdentity) Probe(context.Context, *addonsid.ProbeRequest) (*addonsid.ProbeResponse, error) {
	return &addonsid.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
