"""The kernel-log follower: XIDs and NVSwitch SXids from /dev/kmsg, a log file or a FIFO."""
