// Torch-facing side of the ag-gemm CUDA backend: the flag launches (signal_peers, wait_flags); the copies and the
// GEMMs are torch calls from entry.py.
#include "peer_binding.h"
