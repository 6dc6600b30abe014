"""Generated kubelet PodResources v1 stubs (hack/gen-podresources.sh). Do not edit."""
