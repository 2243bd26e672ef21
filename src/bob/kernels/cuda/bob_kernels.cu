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

#define WARP 32u
#define FULL_WARP 0xFFFFFFFFu

// max as the select `b > a ? b : a` (a held, b newcomer): NaN newcomers are skipped
// and of equal values the held one stays; spelled out so no fmaxf is used.
static __device__ __forceinline__ float select_max(float held, float newcomer) {
    return newcomer > held ? newcomer : held;
}

struct SumOp {
    __device__ float operator()(float held, float incoming) const { return add(held, incoming); }
};
struct MaxOp {
    __device__ float operator()(float held, float incoming) const {
        return select_max(held, incoming);
    }
};

// The 256-lane tree of ARITHMETIC.md section 6 after a single barrier: every warp reads
// the 256 partials and runs the whole tree itself. Lane t holds partials t, t + 32, ...,
// t + 224, so levels 128, 64 and 32 combine values it holds; levels 16 ... 1 are
// shuffles (lane t < s takes lane t + s). Every thread returns the result. `buffer` may
// be written again only after another barrier, so callers alternate two (Lanes).
template <typename Op>
static __device__ float tree(float partial, float* buffer, Op op) {
    buffer[threadIdx.x] = partial;
    __syncthreads();
    const u32 t = threadIdx.x % WARP;
    float a[8];
#pragma unroll
    for (u32 i = 0; i < 8; ++i) a[i] = buffer[t + WARP * i];
#pragma unroll
    for (u32 i = 0; i < 4; ++i) a[i] = op(a[i], a[i + 4]);  // s = 128
    a[0] = op(a[0], a[2]);  // s = 64
    a[1] = op(a[1], a[3]);
    float x = op(a[0], a[1]);  // s = 32
#pragma unroll
    for (u32 s = WARP / 2; s > 0; s >>= 1) x = op(x, __shfl_down_sync(FULL_WARP, x, s));
    return __shfl_sync(FULL_WARP, x, 0);
}

// The seed kernels' block reductions: the tree above, then a barrier so the caller
// may write `shared` again at once. Every lane gets the result.
static __device__ float block_sum(float partial, float* shared) {
    const float total = tree(partial, shared, SumOp());
    __syncthreads();
    return total;
}

static __device__ float block_max(float partial, float* shared) {
    const float total = tree(partial, shared, MaxOp());
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

// AdamW over rows x columns elements, grid-stride, in the specified order:
// w *= decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= step (m / (sqrt v + eps)).
// The count is a 64-bit product: a V x V table has 2^32 elements at V = 65536.
extern "C" __global__ void bob_adamw(float* parameters, const float* gradients,
                                     float* first_moment, float* second_moment, float decay,
                                     float beta1, float one_minus_beta1, float beta2,
                                     float one_minus_beta2, float step_size, float eps_hat,
                                     u32 rows, u32 columns) {
    const u64 count = (u64)rows * columns;
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

// ---------------------------------------------------------------------------------------
// The fused schedule (docs/ARITHMETIC.md, "bob-fused-train"): one block per row runs
// `updates` updates of its row, each the row's gradient from the current parameters (the
// operations of bob_loss_gradient_*) then AdamW with update k's scalars (those of
// bob_adamw, read from row k of adam_scalars); with `finish`, the loss and gradient of the
// final row are stored. A row's loss and gradient depend on that row alone, so blocks
// never wait for each other: one launch can run every update of an invocation.
//
// Two paths, chosen by V, store the same bits:
// - rows of V <= RESIDENT_VOCAB keep parameters, moments (and weights) in registers for
//   all the launch's updates;
// - longer rows live in global memory: per update w is read three times (the row max, the
//   row sum, the update: from DRAM the first time, then mostly from L1), m and v once, and
//   w, m, v written once. When the plan gives a launch one update that is 24 bytes per
//   parameter from DRAM; when it gives all of them, a block's row stays in L1/L2 between
//   updates. The exponentials of the row sum are kept in shared memory for the update
//   (the first KEPT_EXPONENTIALS of a row) rather than computed twice.
// Stored NaNs are canonical; values kept in registers between updates are not, which
// changes no result: every operation maps a NaN to a NaN, whatever its payload, and the
// max select skips NaN.
//
// The tuning macros (KEPT_EXPONENTIALS, BATCH, FUSED_BOUNDS) change speed, never bits;
// their values are the fastest measured at V = 8192 on an H200 (bench/bench_fused.py
// --experiments: 528 us per update streamed; no launch bounds 752, BATCH 2 623, BATCH 8
// 637, no kept exponentials 558).

#define ADAM_STRIDE 8u  // floats per row of adam_scalars: 7 scalars and padding
#ifndef RESIDENT_SLOTS
#define RESIDENT_SLOTS 4u  // row elements per lane in registers on the resident path
#endif
#define RESIDENT_VOCAB (RESIDENT_SLOTS * LANES)
// The wide kernels keep rows up to WIDE_VOCAB on chip: 16 elements per lane (w, m, v, e
// and corpus weights in registers) at up to 128 registers, so 2 blocks share an SM.
// Measured on an H200 at V = 4096, 100 updates: 72 us per update, against 102 streamed
// by the narrow kernel (docs/BENCHMARKS.md). Wider rows do not pay: 32 elements per lane
// leave one block per SM (452 us at V = 8192 against 440 streamed).
#ifndef WIDE_SLOTS
#define WIDE_SLOTS 16u
#endif
#define WIDE_VOCAB (WIDE_SLOTS * LANES)
#ifndef WIDE_BOUNDS
#define WIDE_BOUNDS __launch_bounds__(LANES, 2)
#endif
#ifndef KEPT_EXPONENTIALS
#define KEPT_EXPONENTIALS 8192u  // e_j of a streamed row kept in shared memory (32 KiB)
#endif
#ifndef BATCH
#define BATCH 4u  // elements per lane loaded together on the streaming path
#endif
#ifndef FUSED_BOUNDS
// At most 64 registers, so 4 blocks of 256 lanes fit an SM: more warps hide memory latency.
#define FUSED_BOUNDS __launch_bounds__(LANES, 4)
#endif

// Block reductions over two shared buffers used in turn.
struct Lanes {
    float (*buffers)[LANES];
    u32 turn;
    __device__ float sum(float partial) { return tree(partial, next(), SumOp()); }
    __device__ float max(float partial) { return tree(partial, next(), MaxOp()); }
    __device__ float* next() {
        float* buffer = buffers[turn];
        turn ^= 1u;
        return buffer;
    }
};

struct AdamStep {
    float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, eps_hat;
};

static __device__ __forceinline__ AdamStep adam_step(const float* row) {
    return AdamStep{row[0], row[1], row[2], row[3], row[4], row[5], row[6]};
}

// bob_adamw on one element, in place.
static __device__ __forceinline__ void adamw_element(const AdamStep& a, float g, float& w,
                                                     float& m, float& v) {
    const float decayed = mul(w, a.decay);
    m = add(mul(m, a.beta1), mul(a.one_minus_beta1, g));
    v = add(mul(v, a.beta2), mul(mul(g, g), a.one_minus_beta2));
    w = sub(decayed, dvd(mul(a.step_size, m), add(__fsqrt_rn(v), a.eps_hat)));
}

struct FusedArgs {
    float* parameters;
    float* first_moment;
    float* second_moment;
    float* gradients;
    const u32* targets;  // hard targets, or
    const float* weights;  // corpus weights
    float* loss;
    const float* adam_scalars;
    float log2e, ln2, inverse_rows;
    u32 vocab, updates, finish;
};

// Element j's gradient from p_j = e_j / s: hard p (1/V), and (p - 1) (1/V) at the
// target; corpus rowsum(T) p - T_j.
template <bool CORPUS>
static __device__ __forceinline__ float gradient(const FusedArgs& a, float p, u32 j,
                                                 u32 target, float weight_sum, float weight) {
    if (CORPUS) return sub(mul(weight_sum, p), weight);
    return j == target ? mul(sub(p, 1.0f), a.inverse_rows) : mul(p, a.inverse_rows);
}

// The row's loss from the final row, element by element: hard, the lane holding the
// target stores it (a target >= V, never admitted, gives NaN); corpus, a sum.
template <bool CORPUS>
struct RowLoss {
    float partial;
    __device__ void add_element(const FusedArgs& a, float big_l, float z, u32 j, u32 target,
                                float weight) {
        if (CORPUS) {
            partial = add(partial, mul(sub(big_l, z), weight));
        } else if (j == target) {
            a.loss[blockIdx.x] = canonical(mul(a.ln2, sub(big_l, z)));
        }
    }
    __device__ void store(const FusedArgs& a, u32 target, Lanes& lanes) {
        if (CORPUS) {
            const float total = lanes.sum(partial);
            if (threadIdx.x == 0) a.loss[blockIdx.x] = canonical(mul(a.ln2, total));
        } else if (target >= a.vocab && threadIdx.x == 0) {
            a.loss[blockIdx.x] = f32(CANONICAL_NAN);
        }
    }
};

// -- resident: the row in registers, element j = lane + 256 i in slot i ---------------------

// Row max m, e_i = exp2((w_i - m) log2e) into e, and the row sum s, returned.
template <u32 SLOTS>
static __device__ float resident_exponentials(const FusedArgs& a, const float* w, float* e,
                                              float& m, Lanes& lanes) {
    float held = f32(NEG_INF);
#pragma unroll
    for (u32 i = 0; i < SLOTS; ++i) {
        if (threadIdx.x + LANES * i < a.vocab) held = select_max(held, w[i]);
    }
    m = lanes.max(held);
    float partial = 0.0f;
#pragma unroll
    for (u32 i = 0; i < SLOTS; ++i) {
        if (threadIdx.x + LANES * i < a.vocab) {
            e[i] = bob_exp2(exponent(w[i], m, a.log2e));
            partial = add(partial, e[i]);
        }
    }
    return lanes.sum(partial);
}

template <bool CORPUS, u32 SLOTS>
static __device__ void fused_resident(const FusedArgs& a, Lanes& lanes) {
    const u64 base = (u64)blockIdx.x * a.vocab;
    float w[SLOTS], m[SLOTS], v[SLOTS];
    float t[SLOTS], e[SLOTS];
    float weight_partial = 0.0f;
#pragma unroll
    for (u32 i = 0; i < SLOTS; ++i) {
        const u32 j = threadIdx.x + LANES * i;
        w[i] = m[i] = v[i] = t[i] = e[i] = 0.0f;
        if (j < a.vocab) {
            w[i] = a.parameters[base + j];
            m[i] = a.first_moment[base + j];
            v[i] = a.second_moment[base + j];
            if (CORPUS) {
                t[i] = a.weights[base + j];
                weight_partial = add(weight_partial, t[i]);
            }
        }
    }
    const float weight_sum = CORPUS ? lanes.sum(weight_partial) : 0.0f;
    const u32 target = CORPUS ? 0u : a.targets[blockIdx.x];

    for (u32 k = 0; k < a.updates; ++k) {
        const AdamStep step = adam_step(a.adam_scalars + ADAM_STRIDE * k);
        float row_max;
        const float s = resident_exponentials<SLOTS>(a, w, e, row_max, lanes);
#pragma unroll
        for (u32 i = 0; i < SLOTS; ++i) {
            const u32 j = threadIdx.x + LANES * i;
            if (j < a.vocab) {
                const float g = gradient<CORPUS>(a, dvd(e[i], s), j, target, weight_sum, t[i]);
                adamw_element(step, g, w[i], m[i], v[i]);
            }
        }
    }

    if (a.finish) {
        float row_max;
        const float s = resident_exponentials<SLOTS>(a, w, e, row_max, lanes);
        const float big_l = bob_log2(s);
        RowLoss<CORPUS> loss{0.0f};
#pragma unroll
        for (u32 i = 0; i < SLOTS; ++i) {
            const u32 j = threadIdx.x + LANES * i;
            if (j < a.vocab) {
                const float g = gradient<CORPUS>(a, dvd(e[i], s), j, target, weight_sum, t[i]);
                a.gradients[base + j] = canonical(g);
                loss.add_element(a, big_l, exponent(w[i], row_max, a.log2e), j, target, t[i]);
            }
        }
        loss.store(a, target, lanes);
    }
#pragma unroll
    for (u32 i = 0; i < SLOTS; ++i) {
        const u32 j = threadIdx.x + LANES * i;
        if (j < a.vocab) {
            a.parameters[base + j] = canonical(w[i]);
            a.first_moment[base + j] = canonical(m[i]);
            a.second_moment[base + j] = canonical(v[i]);
        }
    }
}

// -- streaming: the row in global memory, its exponentials in shared memory ----------------
//
// Lane l visits its elements j = l + 256 i in batches of BATCH: a batch's loads are issued
// together, so each warp keeps several requests to memory in flight.

// x[b] = w[first + LANES b] for each b inside the row: BATCH loads in flight before any use.
static __device__ __forceinline__ void load_batch(const FusedArgs& a, const float* w, u32 first,
                                                  float (&x)[BATCH]) {
#pragma unroll
    for (u32 b = 0; b < BATCH; ++b) {
        const u32 j = first + LANES * b;
        if (j < a.vocab) x[b] = w[j];
    }
}

// Row max m of w.
static __device__ float streaming_max(const FusedArgs& a, const float* w, Lanes& lanes) {
    float held = f32(NEG_INF);
    for (u32 first = threadIdx.x; first < a.vocab; first += LANES * BATCH) {
        float x[BATCH];
        load_batch(a, w, first, x);
#pragma unroll
        for (u32 b = 0; b < BATCH; ++b) {
            if (first + LANES * b < a.vocab) held = select_max(held, x[b]);
        }
    }
    return lanes.max(held);
}

// e_j = exp2((w_j - m) log2e), the first KEPT_EXPONENTIALS into `kept`; the row sum.
static __device__ float streaming_sum(const FusedArgs& a, const float* w, float m, float* kept,
                                      Lanes& lanes) {
    float partial = 0.0f;
    for (u32 first = threadIdx.x; first < a.vocab; first += LANES * BATCH) {
        float x[BATCH];
        load_batch(a, w, first, x);
#pragma unroll
        for (u32 b = 0; b < BATCH; ++b) {
            const u32 j = first + LANES * b;
            if (j < a.vocab) {
                const float e = bob_exp2(exponent(x[b], m, a.log2e));
                if (j < KEPT_EXPONENTIALS) kept[j] = e;
                partial = add(partial, e);
            }
        }
    }
    return lanes.sum(partial);
}

// e_j again: kept (each lane reads only what it wrote), or past them the same operations.
static __device__ __forceinline__ float exponential_again(const FusedArgs& a, const float* kept,
                                                          float w, u32 j, float m) {
    return j < KEPT_EXPONENTIALS ? kept[j] : bob_exp2(exponent(w, m, a.log2e));
}

template <bool CORPUS>
static __device__ void fused_streaming(const FusedArgs& a, Lanes& lanes, float* kept) {
    const u64 base = (u64)blockIdx.x * a.vocab;
    float* w = a.parameters + base;
    float* m = a.first_moment + base;
    float* v = a.second_moment + base;
    const float* t = CORPUS ? a.weights + base : nullptr;
    float weight_sum = 0.0f;
    if (CORPUS) {
        float partial = 0.0f;
        for (u32 j = threadIdx.x; j < a.vocab; j += LANES) partial = add(partial, t[j]);
        weight_sum = lanes.sum(partial);
    }
    const u32 target = CORPUS ? 0u : a.targets[blockIdx.x];

    for (u32 k = 0; k < a.updates; ++k) {
        const AdamStep step = adam_step(a.adam_scalars + ADAM_STRIDE * k);
        const float row_max = streaming_max(a, w, lanes);
        const float s = streaming_sum(a, w, row_max, kept, lanes);
        for (u32 first = threadIdx.x; first < a.vocab; first += LANES * BATCH) {
            float wb[BATCH], mb[BATCH], vb[BATCH], tb[BATCH];
#pragma unroll
            for (u32 b = 0; b < BATCH; ++b) {
                const u32 j = first + LANES * b;
                if (j < a.vocab) {
                    wb[b] = w[j];
                    mb[b] = m[j];
                    vb[b] = v[j];
                    tb[b] = CORPUS ? t[j] : 0.0f;
                }
            }
#pragma unroll
            for (u32 b = 0; b < BATCH; ++b) {
                const u32 j = first + LANES * b;
                if (j < a.vocab) {
                    const float p = dvd(exponential_again(a, kept, wb[b], j, row_max), s);
                    const float g = gradient<CORPUS>(a, p, j, target, weight_sum, tb[b]);
                    adamw_element(step, g, wb[b], mb[b], vb[b]);
                    w[j] = canonical(wb[b]);
                    m[j] = canonical(mb[b]);
                    v[j] = canonical(vb[b]);
                }
            }
        }
    }

    if (a.finish) {
        const float row_max = streaming_max(a, w, lanes);
        const float s = streaming_sum(a, w, row_max, kept, lanes);
        const float big_l = bob_log2(s);
        RowLoss<CORPUS> loss{0.0f};
        for (u32 first = threadIdx.x; first < a.vocab; first += LANES * BATCH) {
            float wb[BATCH], tb[BATCH];
#pragma unroll
            for (u32 b = 0; b < BATCH; ++b) {
                const u32 j = first + LANES * b;
                if (j < a.vocab) {
                    wb[b] = w[j];
                    tb[b] = CORPUS ? t[j] : 0.0f;
                }
            }
#pragma unroll
            for (u32 b = 0; b < BATCH; ++b) {
                const u32 j = first + LANES * b;
                if (j < a.vocab) {
                    const float p = dvd(exponential_again(a, kept, wb[b], j, row_max), s);
                    a.gradients[base + j] = canonical(gradient<CORPUS>(a, p, j, target,
                                                                       weight_sum, tb[b]));
                    loss.add_element(a, big_l, exponent(wb[b], row_max, a.log2e), j, target,
                                     tb[b]);
                }
            }
        }
        loss.store(a, target, lanes);
    }
}

// Shared memory of a fused block: the reductions' two buffers, the kept exponentials.
struct FusedShared {
    float buffers[2][LANES];
    float kept[KEPT_EXPONENTIALS > 0 ? KEPT_EXPONENTIALS : 1];
};

// Rows up to SLOTS x 256 stay in registers; longer ones stream. Either path gives the
// same bits for any V, so a kernel is correct whatever V it is launched with.
template <bool CORPUS, u32 SLOTS>
static __device__ void fused_train(const FusedArgs& a, FusedShared& shared) {
    if (blockDim.x != LANES) __trap();
    if (blockIdx.x >= a.vocab) return;  // the whole block: no barrier is left waiting
    Lanes lanes{shared.buffers, 0u};
    if (a.vocab <= SLOTS * LANES) {
        fused_resident<CORPUS, SLOTS>(a, lanes);
    } else {
        fused_streaming<CORPUS>(a, lanes, shared.kept);
    }
}

extern "C" __global__ FUSED_BOUNDS void bob_fused_train_hard(float* parameters, float* first_moment,
                                                float* second_moment, float* gradients,
                                                const u32* targets, float* loss,
                                                const float* adam_scalars, float log2e,
                                                float ln2, float inverse_rows, u32 vocab,
                                                u32 updates, u32 finish) {
    __shared__ FusedShared shared;
    const FusedArgs a{parameters, first_moment, second_moment, gradients, targets, nullptr,
                      loss, adam_scalars, log2e, ln2, inverse_rows, vocab, updates, finish};
    fused_train<false, RESIDENT_SLOTS>(a, shared);
}

extern "C" __global__ FUSED_BOUNDS void bob_fused_train_corpus(float* parameters, float* first_moment,
                                                  float* second_moment, float* gradients,
                                                  const float* weights, float* loss,
                                                  const float* adam_scalars, float log2e,
                                                  float ln2, u32 vocab, u32 updates,
                                                  u32 finish) {
    __shared__ FusedShared shared;
    const FusedArgs a{parameters, first_moment, second_moment, gradients, nullptr, weights,
                      loss, adam_scalars, log2e, ln2, 0.0f, vocab, updates, finish};
    fused_train<true, RESIDENT_SLOTS>(a, shared);
}

// The same kernels for 1024 < V <= WIDE_VOCAB: whole rows on chip, two blocks per SM.
extern "C" __global__ WIDE_BOUNDS void bob_fused_train_wide_hard(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const u32* targets, float* loss, const float* adam_scalars, float log2e, float ln2,
        float inverse_rows, u32 vocab, u32 updates, u32 finish) {
    __shared__ FusedShared shared;
    const FusedArgs a{parameters, first_moment, second_moment, gradients, targets, nullptr,
                      loss, adam_scalars, log2e, ln2, inverse_rows, vocab, updates, finish};
    fused_train<false, WIDE_SLOTS>(a, shared);
}

extern "C" __global__ WIDE_BOUNDS void bob_fused_train_wide_corpus(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const float* weights, float* loss, const float* adam_scalars, float log2e, float ln2,
        u32 vocab, u32 updates, u32 finish) {
    __shared__ FusedShared shared;
    const FusedArgs a{parameters, first_moment, second_moment, gradients, nullptr, weights,
                      loss, adam_scalars, log2e, ln2, 0.0f, vocab, updates, finish};
    fused_train<true, WIDE_SLOTS>(a, shared);
}
