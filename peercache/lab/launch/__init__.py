"""Processes on hosts: local, network-namespace and SSH hosts, pair and group runners, the Soft-RoCE guest."""
