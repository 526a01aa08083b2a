"""The embedded torch engine and its kernels: batching, prefix cache, attention, sampling."""
