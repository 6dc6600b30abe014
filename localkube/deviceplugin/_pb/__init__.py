"""Generated kubelet device-plugin v1beta1 stubs (hack/gen-deviceplugin.sh). Do not edit."""
