// Bob's five kernels in CUDA C: the operation sequences of docs/ARITHMETIC.md.
//
// Every backend must store the same bytes as the NumPy reference
// (src/bob/kernels/reference.py), so each float operation is spelled with an IEEE
// round-to-nearest intrinsic (__fadd_rn, __fmul_rn, __fdiv_rn, __fsqrt_rn): the
// compiler never contracts those into FMA or approximates them, whatever the flags.
// Compile with NVRTC: --fmad=false -prec-div=true -prec-sqrt=true -ftz=false.
// No headers: NVRTC provides the intrinsics.
//
// Kernels that reduce run with blockDim.x == 256 (LANES) and trap otherwise:
// the reduction order, and so the bits, depend on it.

#define LANES 256u

typedef unsigned int u32;
typedef unsigned long long u64;

// Binary32 constants by their bits; tests/test_arith.py proves each correctly rounded.
#define EXP2_C0 0x3F800000u  // 1
#define EXP2_C1 0x3F317218u  // ln2
#define EXP2_C2 0x3E75FDF0u  // ln2^2/2!
#define EXP2_C3 0x3D635847u  // ln2^3/3!
#define EXP2_C4 0x3C1D955Bu  // ln2^4/4!
#define EXP2_C5 0x3AAEC3FFu  // ln2^5/5!
#define EXP2_C6 0x39218489u  // ln2^6/6!
#define EXP2_C7 0x377FE5FEu  // ln2^7/7!
#define LOG2_A1 0x4038AA3Bu  // 2/(1 ln2)
#define LOG2_A3 0x3F76384Fu  // 2/(3 ln2)
#define LOG2_A5 0x3F13BB63u  // 2/(5 ln2)
#define LOG2_A7 0x3ED30BB1u  // 2/(7 ln2)
#define LOG2_A9 0x3EA4258Au  // 2/(9 ln2)
#define SQRT2_BELOW 0x3FB504F3u  // the largest binary32 below sqrt(2)
#define EXP2_LOW 0xC3170000u  // -151: below, 2^x rounds to 0
#define EXP2_HIGH 0x43010000u  // 129: above, 2^x overflows
#define MIN_NORMAL 0x00800000u  // 2^-126
#define TWO_POW_24 0x4B800000u
#define POS_INF 0x7F800000u
#define NEG_INF 0xFF800000u
#define CANONICAL_NAN 0x7FFFFFFFu  // every NaN a kernel stores (payloads differ by device)

static __device__ __forceinline__ float f32(u32 bits) { return __int_as_float((int)bits); }
static __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
static __device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
static __device__ __forceinline__ float dvd(float a, float b) { return __fdiv_rn(a, b); }

// What a kernel stores: NaN always as one pattern, so CPU and GPU bytes agree.
static __device__ __forceinline__ float canonical(float x) {
    return x != x ? f32(CANONICAL_NAN) : x;
}

// 2^k from its bits, for an integer k in [-126, 127]: exact.
static __device__ __forceinline__ float pow2i(int k) { return __int_as_float((k + 127) << 23); }

// 2^x: n = rint(x), f = x - n, a degree-7 Taylor polynomial of 2^f by Horner,
// then two exact power-of-two scalings of which only the last may round.
static __device__ float bob_exp2(float x) {
    float xc = x < f32(EXP2_LOW) ? f32(EXP2_LOW) : x;  // NaN passes both selects
    xc = xc > f32(EXP2_HIGH) ? f32(EXP2_HIGH) : xc;
    const float n = rintf(xc);  // round half to even
    const float f = sub(xc, n);  // exact, in [-0.5, 0.5]
    float p = mul(f, f32(EXP2_C7));
    p = mul(add(p, f32(EXP2_C6)), f);
    p = mul(add(p, f32(EXP2_C5)), f);
    p = mul(add(p, f32(EXP2_C4)), f);
    p = mul(add(p, f32(EXP2_C3)), f);
    p = mul(add(p, f32(EXP2_C2)), f);
    p = mul(add(p, f32(EXP2_C1)), f);
    p = add(p, f32(EXP2_C0));
    const int k = __float2int_rn(n);  // NaN gives 0 here, and p is NaN anyway
    const int k1 = k >> 1;  // floor(k / 2): both halves are normal exponents
    p = mul(p, pow2i(k1));  // exact
    return mul(p, pow2i(k - k1));  // the one rounding: subnormal, 0 or inf
}

// log2(x): x = m * 2^e with m in [sqrt(1/2), sqrt(2)), t = (m - 1) / (m + 1),
// log2(m) = t * (a1 + a3 t^2 + ... + a9 t^8) by Horner in t^2, plus e.
static __device__ float bob_log2(float x) {
    if (!(x > 0.0f)) return x == 0.0f ? f32(NEG_INF) : f32(CANONICAL_NAN);
    if (x == f32(POS_INF)) return x;
    int adjust = 0;
    if (x < f32(MIN_NORMAL)) {  // subnormal: scale into the normal range, exactly
        x = mul(x, f32(TWO_POW_24));
        adjust = 24;
    }
    const int bits = __float_as_int(x);
    int e = (bits >> 23) - 127 - adjust;
    float m = __int_as_float((bits & 0x007FFFFF) | 0x3F800000);  // [1, 2)
    if (m > f32(SQRT2_BELOW)) {
        m = mul(m, 0.5f);  // exact
        e = e + 1;
    }
    const float t = dvd(sub(m, 1.0f), add(m, 1.0f));  // m - 1 is exact
    const float u = mul(t, t);
    float q = mul(u, f32(LOG2_A9));
    q = mul(add(q, f32(LOG2_A7)), u);
    q = mul(add(q, f32(LOG2_A5)), u);
    q = mul(add(q, f32(LOG2_A3)), u);
    q = add(q, f32(LOG2_A1));
    return add((float)e, mul(t, q));  // (float)e is exact
}

// The tree over 256 lanes: for s = 128, 64, ..., 1, lane l < s combines lane l + s
// into itself. Every lane gets the result.
static __device__ float block_sum(float partial, float* shared) {
    const u32 lane = threadIdx.x;
    shared[lane] = partial;
    __syncthreads();
    for (u32 s = LANES / 2; s > 0; s >>= 1) {
        if (lane < s) shared[lane] = add(shared[lane], shared[lane + s]);
        __syncthreads();
    }
    const float total = shared[0];
    __syncthreads();  // the caller may reuse `shared` at once
    return total;
}

// max as the select `b > a ? b : a` (a held, b newcomer): NaN newcomers are skipped
// and of equal values the held one stays; spelled out so no fmaxf is used.
static __device__ __forceinline__ float select_max(float held, float newcomer) {
    return newcomer > held ? newcomer : held;
}

static __device__ float block_max(float partial, float* shared) {
    const u32 lane = threadIdx.x;
    shared[lane] = partial;
    __syncthreads();
    for (u32 s = LANES / 2; s > 0; s >>= 1) {
        if (lane < s) shared[lane] = select_max(shared[lane], shared[lane + s]);
        __syncthreads();
    }
    const float total = shared[0];
    __syncthreads();
    return total;
}

// Row max: lane l takes elements l, l + 256, ... in turn from -inf, then the tree.
static __device__ float row_max(const float* w, u32 vocab, float* shared) {
    float held = f32(NEG_INF);
    for (u32 j = threadIdx.x; j < vocab; j += LANES) held = select_max(held, w[j]);
    return block_max(held, shared);
}

// z_j = (w_j - m) * log2e: the softmax exponent in the log2 domain.
static __device__ __forceinline__ float exponent(float w, float m, float log2e) {
    return mul(sub(w, m), log2e);
}

// logits[j] = table[prompt[0] * V + j], copied as bits; a prompt >= V (never admitted
// by the host) gives a row of NaN rather than a read outside the table.
extern "C" __global__ void bob_row_gather(float* logits, const u32* prompt, const float* table,
                                          u32 vocab) {
    const u32 row = prompt[0];
    u32* out = (u32*)logits;
    const u32* in = (const u32*)table + (u64)row * vocab;
    for (u32 j = threadIdx.x; j < vocab; j += blockDim.x) {
        out[j] = row < vocab ? in[j] : CANONICAL_NAN;
    }
}

// One block per row r (grid.x = V): loss[r] = ln2 * (log2(s) - z_t) and
// gradients[r][j] = p_j * (1/V), (p_t - 1) * (1/V) at the target, p_j = e_j / s.
extern "C" __global__ void bob_loss_gradient_hard(const float* parameters, float* gradients,
                                                  const u32* targets, float* loss, float log2e,
                                                  float ln2, float inverse_rows, u32 vocab) {
    __shared__ float shared[LANES];
    if (blockDim.x != LANES) __trap();
    const u32 row = blockIdx.x;
    if (row >= vocab) return;  // the whole block: no barrier is left waiting
    const float* w = parameters + (u64)row * vocab;
    float* g = gradients + (u64)row * vocab;
    const u32 target = targets[row];

    const float m = row_max(w, vocab, shared);

    float partial = 0.0f;
    for (u32 j = threadIdx.x; j < vocab; j += LANES) {
        partial = add(partial, bob_exp2(exponent(w[j], m, log2e)));
    }
    const float s = block_sum(partial, shared);

    // e_j again rather than stored: the same operations give the same bits.
    for (u32 j = threadIdx.x; j < vocab; j += LANES) {
        const float p = dvd(bob_exp2(exponent(w[j], m, log2e)), s);
        const float grad = j == target ? mul(sub(p, 1.0f), inverse_rows) : mul(p, inverse_rows);
        g[j] = canonical(grad);
    }
    if (threadIdx.x == 0) {
        float value = f32(CANONICAL_NAN);  // a target >= V (never admitted) has no loss
        if (target < vocab) value = mul(ln2, sub(bob_log2(s), exponent(w[target], m, log2e)));
        loss[row] = canonical(value);
    }
}

// One block per row r (grid.x = V), weights T: loss[r] = ln2 * sum_j T_j (L - z_j)
// with L = log2(s), and gradients[r][j] = rowsum(T) * p_j - T_j.
extern "C" __global__ void bob_loss_gradient_corpus(const float* parameters, float* gradients,
                                                    const float* weights, float* loss,
                                                    float log2e, float ln2, u32 vocab) {
    __shared__ float shared[LANES];
    if (blockDim.x != LANES) __trap();
    const u32 row = blockIdx.x;
    if (row >= vocab) return;
    const float* w = parameters + (u64)row * vocab;
    const float* t = weights + (u64)row * vocab;
    float* g = gradients + (u64)row * vocab;

    const float m = row_max(w, vocab, shared);

    float partial_e = 0.0f;
    float partial_t = 0.0f;
    for (u32 j = threadIdx.x; j < vocab; j += LANES) {
        partial_e = add(partial_e, bob_exp2(exponent(w[j], m, log2e)));
        partial_t = add(partial_t, t[j]);
    }
    const float s = block_sum(partial_e, shared);
    const float weight_sum = block_sum(partial_t, shared);
    const float big_l = bob_log2(s);

    float partial_loss = 0.0f;
    for (u32 j = threadIdx.x; j < vocab; j += LANES) {
        const float z = exponent(w[j], m, log2e);
        const float p = dvd(bob_exp2(z), s);
        partial_loss = add(partial_loss, mul(sub(big_l, z), t[j]));
        g[j] = canonical(sub(mul(weight_sum, p), t[j]));
    }
    const float total = block_sum(partial_loss, shared);
    if (threadIdx.x == 0) loss[row] = canonical(mul(ln2, total));
}

// AdamW over `count` elements, grid-stride, in the specified order:
// w *= decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= step (m / (sqrt v + eps)).
extern "C" __global__ void bob_adamw(float* parameters, const float* gradients,
                                     float* first_moment, float* second_moment, float decay,
                                     float beta1, float one_minus_beta1, float beta2,
                                     float one_minus_beta2, float step_size, float eps_hat,
                                     u32 count) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const float g = gradients[i];
        const float w = mul(parameters[i], decay);
        const float m = add(mul(first_moment[i], beta1), mul(one_minus_beta1, g));
        const float v = add(mul(second_moment[i], beta2), mul(mul(g, g), one_minus_beta2));
        const float step = dvd(mul(step_size, m), add(__fsqrt_rn(v), eps_hat));
        parameters[i] = canonical(sub(w, step));
        first_moment[i] = canonical(m);
        second_moment[i] = canonical(v);
    }
}

// Does (value, index) rank above (best, best_index)? NaN ranks above every number
// (as numpy.argmax); equal values go to the lower index. A total order, so the
// result does not depend on the reduction order.
static __device__ __forceinline__ bool beats(float value, u32 index, float best, u32 best_index) {
    const bool value_nan = value != value;
    const bool best_nan = best != best;
    if (value_nan || best_nan) return value_nan && (!best_nan || index < best_index);
    return value > best || (value == best && index < best_index);
}

// prediction[0] = the lowest j with row[j] maximal; one block of 256 lanes.
extern "C" __global__ void bob_greedy_argmax(u32* prediction, const float* row, u32 vocab) {
    __shared__ float values[LANES];
    __shared__ u32 indices[LANES];
    if (blockDim.x != LANES) __trap();
    const u32 lane = threadIdx.x;
    float best = f32(NEG_INF);
    u32 best_index = 0xFFFFFFFFu;  // loses to every element, even -inf
    for (u32 j = lane; j < vocab; j += LANES) {
        const float value = row[j];
        if (beats(value, j, best, best_index)) {
            best = value;
            best_index = j;
        }
    }
    values[lane] = best;
    indices[lane] = best_index;
    __syncthreads();
    for (u32 s = LANES / 2; s > 0; s >>= 1) {
        if (lane < s && beats(values[lane + s], indices[lane + s], values[lane], indices[lane])) {
            values[lane] = values[lane + s];
            indices[lane] = indices[lane + s];
        }
        __syncthreads();
    }
    if (lane == 0 && blockIdx.x == 0) prediction[0] = indices[0];
}
