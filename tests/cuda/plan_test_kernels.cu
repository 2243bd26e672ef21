// Three small kernels for testing the CUDA backend's mechanics (arena,
// relocation, graphs, scalar patching) independently of Bob's kernels.
// Pointers first, then 4-byte scalars: the plan's parameter block layout.

extern "C" __global__ void test_axpy(float* y, const float* x, float a, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float product = a * x[i];  // --fmad=false: rounded, then added
        y[i] = product + y[i];
    }
}

// Reverses each block of 256 elements through static shared memory.
extern "C" __global__ void test_reverse(float* out, const float* in, unsigned int n)
{
    __shared__ float tile[256];
    unsigned int base = blockIdx.x * blockDim.x;
    unsigned int i = base + threadIdx.x;
    tile[threadIdx.x] = i < n ? in[i] : 0.0f;
    __syncthreads();
    unsigned int j = base + (blockDim.x - 1 - threadIdx.x);
    if (j < n) {
        out[j] = tile[threadIdx.x];
    }
}

extern "C" __global__ void __launch_bounds__(256) test_iota(unsigned int* out, unsigned int start,
                                                           unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = start + 3u * i;
    }
}
