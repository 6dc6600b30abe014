"""``make demo`` / ``python -m demo``: a simulated GPU fleet on a real local control plane.

etcd, kube-apiserver, kube-scheduler and kwok (localkube), eight kwok GPU nodes, a real
``gpuhealth-agent`` process per node with the simulator and its own fault scenario, and the
real ``gpuhealth-controller``; the demo watches the API server and checks that the expected
taints, untaints and idle flags happen (and nothing else), then stops everything.
"""
