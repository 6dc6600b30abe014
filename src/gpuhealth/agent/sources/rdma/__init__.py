"""The RDMA source: the node's InfiniBand and RoCE ports read from sysfs, each paired with the
GPUs behind it by PCIe topology."""
