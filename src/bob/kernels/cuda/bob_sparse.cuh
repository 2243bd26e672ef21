// The sparse corpus input (docs/ARITHMETIC.md, "Sparse corpus input"): included once, at the
// end of bob_kernels.cu, whose helpers it uses.

// table[keys[i]] = values[i] for every i < count, copied as bits. Keys are distinct (the host
// admits no other record), so no two threads write one cell and the order of the writes
// cannot matter; a key outside the V x V table is never written. Grid-stride, 64-bit
// indices: V x V reaches 2^32 at V = 65536. The host clears the table before the launch.
extern "C" __global__ void bob_scatter(float* table, const u64* keys, const float* values,
                                       u32 count, u32 vocab) {
    wait_for_prerequisites();
    const u64 cells = (u64)vocab * vocab;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u32* cell_bits = (u32*)table;
    const u32* value_bits = (const u32*)values;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const u64 key = keys[i];
        if (key < cells) cell_bits[key] = value_bits[i];
    }
}

// bob_loss_gradient_corpus's row loss and nothing else: the same operations in the same
// order, so the same bits, without the gradient's V x V stores (validation must leave the
// training state as it is).
extern "C" __global__ void bob_loss_corpus(const float* parameters, const float* weights,
                                           float* loss, float log2e, float ln2, u32 vocab) {
    wait_for_prerequisites();
    __shared__ float shared[LANES];
    if (blockDim.x != LANES) __trap();
    const u32 row = blockIdx.x;
    if (row >= vocab) return;
    const float* w = parameters + (u64)row * vocab;
    const float* t = weights + (u64)row * vocab;

    const float m = row_max(w, vocab, shared);
    float partial_e = 0.0f;
    for (u32 j = threadIdx.x; j < vocab; j += LANES) {
        partial_e = add(partial_e, bob_exp2(exponent(w[j], m, log2e)));
    }
    const float s = block_sum(partial_e, shared);
    const float big_l = bob_log2(s);

    float partial_loss = 0.0f;
    for (u32 j = threadIdx.x; j < vocab; j += LANES) {
        const float z = exponent(w[j], m, log2e);
        partial_loss = add(partial_loss, mul(sub(big_l, z), t[j]));
    }
    const float total = block_sum(partial_loss, shared);
    if (threadIdx.x == 0) loss[row] = canonical(mul(ln2, total));
}
