// Bob's kernels in CUDA C: the operation sequences of docs/ARITHMETIC.md.
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
//
// Where a kernel's shape was chosen among variants that change speed, never bits (threads
// per row, loads in flight, launch bounds, kept exponentials), the choice is written in
// here; dev/cuda/bob_kernels.cu keeps every variant as a tuning macro, with the benches
// that check and time them.

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

// Programmatic dependent launch (sm_90): the CUDA backend may start a kernel before the
// one it follows has finished (its graph's edges are programmatic), so every kernel first
// waits until the kernels before it have completed and their writes are visible. Where
// a launch has no such predecessor (a plain launch, the nv stream) this returns at once.
// Dependents launch at a kernel's exit (no griddepcontrol.launch_dependents).
static __device__ __forceinline__ void wait_for_prerequisites() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
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

// The 256-lane tree of ARITHMETIC.md section 6 over `partials`, run by one warp: lane t
// holds partials t, t + 32, ..., t + 224, so levels 128, 64 and 32 combine values it
// holds; levels 16 ... 1 are shuffles (lane t < s takes lane t + s). Every lane returns
// the result.
template <typename Op>
static __device__ float warp_tree(const float* partials, Op op) {
    const u32 t = threadIdx.x % WARP;
    float a[8];
#pragma unroll
    for (u32 i = 0; i < 8; ++i) a[i] = partials[t + WARP * i];
#pragma unroll
    for (u32 i = 0; i < 4; ++i) a[i] = op(a[i], a[i + 4]);  // s = 128
    a[0] = op(a[0], a[2]);  // s = 64
    a[1] = op(a[1], a[3]);
    float x = op(a[0], a[1]);  // s = 32
#pragma unroll
    for (u32 s = WARP / 2; s > 0; s >>= 1) x = op(x, __shfl_down_sync(FULL_WARP, x, s));
    return __shfl_sync(FULL_WARP, x, 0);
}

// The tree after a single barrier: every warp reads the 256 partials and runs the whole
// tree itself. `buffer` may be written again only after another barrier, so callers
// alternate two (Lanes).
template <typename Op>
static __device__ float tree(float partial, float* buffer, Op op) {
    buffer[threadIdx.x] = partial;
    __syncthreads();
    return warp_tree(buffer, op);
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
    wait_for_prerequisites();
    const u32 row = prompt[0];
    u32* out = (u32*)logits;
    const u32* in = (const u32*)table + (u64)row * vocab;
    for (u32 j = threadIdx.x; j < vocab; j += blockDim.x) {
        out[j] = row < vocab ? in[j] : CANONICAL_NAN;
    }
}

// The float order as a signed integer order (-0 below +0); NaN never reaches it.
static __device__ __forceinline__ int order_key(float x) {
    const int bits = __float_as_int(x);
    return bits >= 0 ? bits : bits ^ 0x7FFFFFFF;
}

// The float whose order_key is `key` (the map is its own inverse).
static __device__ __forceinline__ float from_order_key(int key) {
    return __int_as_float(key >= 0 ? key : key ^ 0x7FFFFFFF);
}

// The block's max of `held` (never NaN) as the integer max of order keys: each warp's, then
// every warp's reduction of the `warps` keys in `keys`, behind one barrier. Every thread
// gets it (the tall and held kernels; a zero's sign needs the literal tree).
static __device__ __forceinline__ float keyed_block_max(float held, int* keys, u32 warps) {
    const int key = __reduce_max_sync(FULL_WARP, order_key(held));
    if (threadIdx.x % WARP == 0) keys[threadIdx.x / WARP] = key;
    __syncthreads();
    const u32 lane = threadIdx.x % WARP;  // fewer warps than lanes: -inf for the rest
    const int mine = lane < warps ? keys[lane] : order_key(f32(NEG_INF));
    return from_order_key(__reduce_max_sync(FULL_WARP, mine));
}

// IEEE division and square root on sm_90's own fast paths, without their branches.
// ptxas expands __fdiv_rn and __fsqrt_rn into a short sequence (below), a range check, and
// a branch to a slow subroutine where the check fails; each call is its own basic block,
// so a thread's elements go through AdamW one after another (seen in the SASS: eight
// elements per thread ran eight dependent chains in a row). Here every element's fast
// sequence is issued together, then, only where some element's operands fall outside
// the range where the sequence is the correctly rounded result, that stage is done again
// with the intrinsics. The sequences are the instructions ptxas emits for the intrinsics'
// fast paths (MUFU.RCP, then five FFMA; MUFU.RSQ, two FMUL.FTZ, two FFMA), so inside the
// ranges they give the intrinsics' bits; the ranges are narrower than the intrinsics' own
// checks: the sqrt check is the one ptxas emits, the division's keeps both operands and
// the quotient far from the subnormal and overflow ranges (FCHK, the check ptxas uses,
// is not reachable from PTX). tests/test_small_variants.py (gpu) compares root_fast with
// __fsqrt_rn on every binary32 its check admits, and quotient_fast with __fdiv_rn on
// 3.5e10 pseudo-random moderate pairs.

// |x| in [2^-60, 2^60): a division of two such is a normal quotient in (2^-121, 2^121)
// with an exact remainder (no underflow anywhere in the sequence).
static __device__ __forceinline__ bool moderate(float x) {
    const u32 biased = ((u32)__float_as_int(x) >> 23) & 0xFFu;
    return biased - 67u <= 186u - 67u;
}

// a / b, correctly rounded when moderate(a) and moderate(b): the reciprocal estimate,
// one Newton step, the quotient, and its correction by the exact remainder.
static __device__ __forceinline__ float quotient_fast(float a, float b) {
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(b));
    const float r = __fmaf_rn(r0, __fmaf_rn(-b, r0, 1.0f), r0);
    const float q = __fmaf_rn(a, r, 0.0f);
    return __fmaf_rn(r, __fmaf_rn(-b, q, a), q);
}

// The range ptxas's own check lets through to the fast square root: x in [2^-101, max].
static __device__ __forceinline__ bool root_fast_applies(float x) {
    return (u32)__float_as_int(x) - 0x0D000000u <= 0x727FFFFFu;
}

// sqrt(x), correctly rounded when root_fast_applies(x): y = x / sqrt(x) estimate, then one
// correction by the exact residual x - y^2.
static __device__ __forceinline__ float root_fast(float x) {
    float r, y, h;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(r));
    asm("mul.rn.ftz.f32 %0, %1, 0f3F000000;" : "=f"(h) : "f"(r));
    return __fmaf_rn(__fmaf_rn(-y, y, x), h, y);
}

// a / b as __fdiv_rn gives it: the fast sequence where both operands admit it, else the
// intrinsic. The seed kernels hold one element per thread at V = 256, so the branch costs
// nothing there.
static __device__ __forceinline__ float quotient(float a, float b) {
    return (moderate(a) & moderate(b)) ? quotient_fast(a, b) : dvd(a, b);
}

// sqrt(x) as __fsqrt_rn gives it, likewise.
static __device__ __forceinline__ float root(float x) {
    return root_fast_applies(x) ? root_fast(x) : __fsqrt_rn(x);
}

#define SEED_KEPT 2u  // the seed loss-gradient: elements per lane kept in registers

// One block per row r (grid.x = V): loss[r] = ln2 * (log2(s) - z_t) and
// gradients[r][j] = p_j * (1/V), (p_t - 1) * (1/V) at the target, p_j = e_j / s.
// At V = 256 a seed update is two short launches whose every step waits on the one
// before, so the kernel keeps latency low: a lane keeps its first SEED_KEPT elements (w,
// then e_j) in registers rather than reading and computing them again; the max is the
// integer max of order keys (the literal tree only for a zero); the two trees have a
// buffer each, so no barrier follows them.
extern "C" __global__ void bob_loss_gradient_hard(const float* parameters, float* gradients,
                                                  const u32* targets, float* loss, float log2e,
                                                  float ln2, float inverse_rows, u32 vocab) {
    wait_for_prerequisites();
    __shared__ float partials[2][LANES];
    __shared__ int keys[LANES / WARP];
    if (blockDim.x != LANES) __trap();
    const u32 row = blockIdx.x;
    if (row >= vocab) return;  // the whole block: no barrier is left waiting
    const float* w = parameters + (u64)row * vocab;
    float* g = gradients + (u64)row * vocab;
    const u32 target = targets[row];

    // Lane l takes elements l, l + 256, ... in turn from -inf: the first SEED_KEPT kept.
    float x[SEED_KEPT];
#pragma unroll
    for (u32 i = 0; i < SEED_KEPT; ++i) {
        const u32 j = threadIdx.x + LANES * i;
        x[i] = j < vocab ? w[j] : f32(NEG_INF);  // -inf: no element, changes no max
    }
    float held = f32(NEG_INF);
#pragma unroll
    for (u32 i = 0; i < SEED_KEPT; ++i) held = select_max(held, x[i]);
    for (u32 j = threadIdx.x + LANES * SEED_KEPT; j < vocab; j += LANES) {
        held = select_max(held, w[j]);
    }
    float m = keyed_block_max(held, keys, LANES / WARP);
    if (m == 0.0f) m = tree(held, partials[0], MaxOp());  // uniform: a zero's sign

    float e[SEED_KEPT];
    float partial = 0.0f;
#pragma unroll
    for (u32 i = 0; i < SEED_KEPT; ++i) {
        e[i] = bob_exp2(exponent(x[i], m, log2e));
        if (threadIdx.x + LANES * i < vocab) partial = add(partial, e[i]);
    }
    for (u32 j = threadIdx.x + LANES * SEED_KEPT; j < vocab; j += LANES) {
        partial = add(partial, bob_exp2(exponent(w[j], m, log2e)));
    }
    const float s = tree(partial, partials[1], SumOp());

    if (threadIdx.x == LANES - 1u) {  // the last warp, beside its own gradients
        float value = f32(CANONICAL_NAN);  // a target >= V (never admitted) has no loss
        if (target < vocab) value = mul(ln2, sub(bob_log2(s), exponent(w[target], m, log2e)));
        loss[row] = canonical(value);
    }
#pragma unroll
    for (u32 i = 0; i < SEED_KEPT; ++i) {
        const u32 j = threadIdx.x + LANES * i;
        if (j < vocab) {
            const float p = quotient(e[i], s);
            g[j] = canonical(j == target ? mul(sub(p, 1.0f), inverse_rows)
                                         : mul(p, inverse_rows));
        }
    }
    // e_j again past the kept ones: the same operations give the same bits.
    for (u32 j = threadIdx.x + LANES * SEED_KEPT; j < vocab; j += LANES) {
        const float p = quotient(bob_exp2(exponent(w[j], m, log2e)), s);
        g[j] = canonical(j == target ? mul(sub(p, 1.0f), inverse_rows) : mul(p, inverse_rows));
    }
}

// One block per row r (grid.x = V), weights T: loss[r] = ln2 * sum_j T_j (L - z_j)
// with L = log2(s), and gradients[r][j] = rowsum(T) * p_j - T_j.
extern "C" __global__ void bob_loss_gradient_corpus(const float* parameters, float* gradients,
                                                    const float* weights, float* loss,
                                                    float log2e, float ln2, u32 vocab) {
    wait_for_prerequisites();
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
    wait_for_prerequisites();
    const u64 count = (u64)rows * columns;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const float g = gradients[i];
        const float w = mul(parameters[i], decay);
        const float m = add(mul(first_moment[i], beta1), mul(one_minus_beta1, g));
        const float v = add(mul(second_moment[i], beta2), mul(mul(g, g), one_minus_beta2));
        const float step = quotient(mul(step_size, m), add(root(v), eps_hat));
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
    wait_for_prerequisites();
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

// Non-finite (NaN or +-inf): the exponent bits all ones, tested on the bits so no
// compiler flag can change the answer.
static __device__ __forceinline__ u32 non_finite(float x) {
    return (__float_as_uint(x) & POS_INF) == POS_INF;
}

static __device__ __forceinline__ u32 non_finite4(float4 q) {
    return non_finite(q.x) + non_finite(q.y) + non_finite(q.z) + non_finite(q.w);
}

// health[t] += the count of non-finite elements of table t (parameters, first_moment,
// second_moment), each V x V. One pass at memory bandwidth: grid-stride over float4
// quads (the tables are 16-byte aligned, the signature says so), the last V*V mod 4
// elements by the first threads; each warp sums its lanes by shuffles, each block its
// warps in shared memory, and a block adds its totals with one 64-bit atomic per table,
// only where they are not zero (a healthy table costs no atomics). Counts are integers,
// so the order of the additions does not change the result. Every index is 64-bit:
// V*V reaches 2^32 at V = 65536. The host zeroes health before the launch.
static __device__ void count_non_finite(const float* parameters, const float* first_moment,
                                        const float* second_moment, u64* health, u64 count) {
    __shared__ u64 warp_counts[3][LANES / WARP];
    if (blockDim.x != LANES) __trap();  // warp_counts holds LANES / WARP warps
    const u64 quads = count / 4;
    const u64 stride = (u64)gridDim.x * LANES;
    const u64 first = (u64)blockIdx.x * LANES + threadIdx.x;
    const float4* p4 = (const float4*)parameters;
    const float4* m4 = (const float4*)first_moment;
    const float4* v4 = (const float4*)second_moment;
    u64 bad[3] = {0, 0, 0};
    for (u64 q = first; q < quads; q += stride) {
        bad[0] += non_finite4(p4[q]);
        bad[1] += non_finite4(m4[q]);
        bad[2] += non_finite4(v4[q]);
    }
    for (u64 i = 4 * quads + first; i < count; i += stride) {
        bad[0] += non_finite(parameters[i]);
        bad[1] += non_finite(first_moment[i]);
        bad[2] += non_finite(second_moment[i]);
    }
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
#pragma unroll
    for (u32 t = 0; t < 3; ++t) {
#pragma unroll
        for (u32 s = WARP / 2; s > 0; s >>= 1) bad[t] += __shfl_down_sync(FULL_WARP, bad[t], s);
        if (lane == 0) warp_counts[t][warp] = bad[t];
    }
    __syncthreads();
    if (threadIdx.x < 3) {
        u64 total = 0;
        for (u32 w = 0; w < LANES / WARP; ++w) total += warp_counts[threadIdx.x][w];
        if (total != 0) atomicAdd(&health[threadIdx.x], total);
    }
}

extern "C" __global__ void bob_health(const float* parameters, const float* first_moment,
                                      const float* second_moment, u64* health, u32 vocab) {
    wait_for_prerequisites();  // the tables are the last update's
    count_non_finite(parameters, first_moment, second_moment, health, (u64)vocab * vocab);
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

#define ADAM_STRIDE 8u  // floats per row of adam_scalars: 7 scalars and padding
#define RESIDENT_SLOTS 4u  // row elements per lane in registers on the resident path
#define RESIDENT_VOCAB (RESIDENT_SLOTS * LANES)
// The wide kernels keep rows up to WIDE_VOCAB on chip: 16 elements per lane (w, m, v, e
// and corpus weights in registers) at up to 128 registers, so 2 blocks share an SM.
// Wider rows do not pay: 32 elements per lane leave one block per SM.
#define WIDE_SLOTS 16u
#define WIDE_VOCAB (WIDE_SLOTS * LANES)
#define WIDE_BOUNDS __launch_bounds__(LANES, 2)
#define KEPT_EXPONENTIALS 8192u  // e_j of a streamed row kept in shared memory (32 KiB)
#define BATCH 4u  // elements per lane loaded together on the streaming path
// At most 64 registers, so 4 blocks of 256 lanes fit an SM: more warps hide memory latency.
#define FUSED_BOUNDS __launch_bounds__(LANES, 4)

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

// adam_scalars rows staged in shared memory a chunk at a time (the lanes of the block
// each hold one float of a chunk: 32 rows for 256 lanes), the next chunk loaded into a
// register one chunk ahead: a block waits on global memory once per launch rather than
// once per update. Chunk c lives in buffer c % 2, so a lane filling chunk c + 1 never
// overwrites rows a slower warp still reads; the trees' barriers between the fill and the
// first read make the rows visible.
struct StagedScalars {
    float* buffers;  // two chunks of `width` floats
    u32 width;  // lanes that stage: rows per chunk = width / ADAM_STRIDE
    float ahead = 0.0f;  // float threadIdx.x of the next chunk
    __device__ u32 rows() const { return width / ADAM_STRIDE; }
    __device__ float* chunk(u32 k) const { return buffers + width * ((k / rows()) % 2); }
    __device__ float load(const FusedArgs& a, u32 first) const {
        const u32 index = first * ADAM_STRIDE + threadIdx.x;  // within the footprint:
        return index < a.updates * ADAM_STRIDE ? a.adam_scalars[index] : 0.0f;  // 32 N bytes
    }
    // Called with every k, in order, by every lane: fills the chunk that update k opens.
    __device__ void stage(const FusedArgs& a, u32 k) {
        if (k % rows() != 0) return;
        chunk(k)[threadIdx.x] = k == 0 ? load(a, 0) : ahead;
        ahead = load(a, k + rows());
    }
    __device__ AdamStep step(const FusedArgs&, u32 k) const {
        return adam_step(chunk(k) + ADAM_STRIDE * (k % rows()));
    }
};

// Element j's gradient from p_j = e_j / s: hard p (1/V), and (p - 1) (1/V) at the
// target; corpus rowsum(T) p - T_j.
template <bool CORPUS>
static __device__ __forceinline__ float gradient(const FusedArgs& a, float p, u32 j,
                                                 u32 target, float weight_sum, float weight) {
    if (CORPUS) return sub(mul(weight_sum, p), weight);
    return j == target ? mul(sub(p, 1.0f), a.inverse_rows) : mul(p, a.inverse_rows);
}

// The finish of one element of a row held in registers: its gradient stored, and its
// corpus loss term returned (hard: the lane holding the target stores the row's loss).
template <bool CORPUS>
static __device__ __forceinline__ float finish_element(const FusedArgs& a, u64 base, float e,
                                                       float s, float big_l, float w,
                                                       float row_max, u32 j, u32 target,
                                                       float weight_sum, float weight) {
    const float g = gradient<CORPUS>(a, dvd(e, s), j, target, weight_sum, weight);
    a.gradients[base + j] = canonical(g);
    const float z = exponent(w, row_max, a.log2e);
    if (CORPUS) return add(0.0f, mul(sub(big_l, z), weight));
    if (j == target) a.loss[blockIdx.x] = canonical(mul(a.ln2, sub(big_l, z)));
    return 0.0f;
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
static __device__ void fused_resident(const FusedArgs& a, Lanes& lanes,
                                      StagedScalars& scalars) {
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
        scalars.stage(a, k);
        float row_max;
        const float s = resident_exponentials<SLOTS>(a, w, e, row_max, lanes);
        const AdamStep step = scalars.step(a, k);  // after the trees' barriers
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

// -- small rows (V <= 256): 128 threads per row, two elements each ------------------------
//
// Thread t < T = 128 holds elements t and t + 128, the tree's lanes t and t + T: level 128
// of every tree combines the two values a thread holds, in registers (fold); levels 64 and
// 32 go between the row's four warps through shared memory behind a barrier of 128 threads
// (the block stays 256 threads, as the plan and the blockDim check have it: warps 4 to 7
// leave at once). Levels 16 to 1 are shuffles: xor for sums (every lane ends with the same
// bits, addition being commutative bit for bit), down then a broadcast of lane 0 for the
// literal max. The row max, whose order matters only between +0 and -0, is the integer max
// of order keys, one __reduce_max_sync per warp, and the literal tree only when that
// maximum is a zero. A thread's divisions and square roots are issued together
// (adamw_together), and a row of V = 256 runs without bounds tests.

// Warp 0's tree over the 256 `partials` (written before a barrier), published through
// `result` behind one more barrier: every thread returns it.
template <typename Op>
static __device__ __forceinline__ float published_tree(const float* partials, float& result,
                                                       Op op) {
    if (threadIdx.x < WARP) {
        const float total = warp_tree(partials, op);
        if (threadIdx.x == 0) result = total;
    }
    __syncthreads();
    return result;
}

// Lane partials of an element: the max from -inf, the sum from +0 (lanes past V: identity).
static __device__ __forceinline__ float max_partial(float x, bool inside) {
    return inside ? select_max(f32(NEG_INF), x) : f32(NEG_INF);
}

// Levels N/2, N/4, ..., 1 (in units of the stride between a thread's lanes) over a[i] =
// tree lane base + stride i: lane base + stride i takes base + stride (i + n), the lower
// lane held. Returns the thread's partial of tree lane `base`; `a` is overwritten.
template <u32 N, typename Op>
static __device__ __forceinline__ float fold(float (&a)[N], Op op) {
#pragma unroll
    for (u32 n = N / 2; n > 0; n /= 2) {
#pragma unroll
        for (u32 i = 0; i < n; ++i) a[i] = op(a[i], a[i + n]);
    }
    return a[0];
}

// The trees of a row on T threads, each holding the tree's lanes t, t + T, ...
template <u32 T>
struct NarrowTrees {
    static constexpr u32 ELEMENTS = LANES / T;
    static constexpr u32 WARPS = T / WARP;
    static_assert(T == 128u, "a small row runs on 128 threads: four warps");
    float (*buffers)[LANES];
    u32 turn;
    __device__ float* next() {
        float* buffer = buffers[turn];
        turn ^= 1u;
        return buffer;
    }
    // Barrier 0 with a count of T: the launch needs no named barrier beyond the one every
    // kernel has (a QMD built by the nv backend declares one barrier; barrier 1 faulted
    // there).
    __device__ static void barrier() { asm volatile("bar.sync 0, %0;" ::"n"(T) : "memory"); }
    // Levels T/2 ... 1, from each thread's partial of tree lane threadIdx.x.
    template <typename Op>
    __device__ float across(float partial, Op op, bool commutes) {
        // levels T/2 ... 32 across the row's warps, through shared memory
        float* buffer = next();
        buffer[threadIdx.x] = partial;
        barrier();
        float b[WARPS];
#pragma unroll
        for (u32 w = 0; w < WARPS; ++w) b[w] = buffer[threadIdx.x % WARP + WARP * w];
        float x = fold(b, op);
        if (commutes) {
#pragma unroll
            for (u32 s = WARP / 2; s > 0; s >>= 1) x = op(x, __shfl_xor_sync(FULL_WARP, x, s));
            return x;
        }
#pragma unroll
        for (u32 s = WARP / 2; s > 0; s >>= 1) x = op(x, __shfl_down_sync(FULL_WARP, x, s));
        return __shfl_sync(FULL_WARP, x, 0);
    }
    // The whole tree over the thread's lane partials (partials[i]: lane t + T i).
    template <typename Op>
    __device__ float reduce(const float (&partials)[ELEMENTS], Op op, bool commutes) {
        float a[ELEMENTS];
#pragma unroll
        for (u32 i = 0; i < ELEMENTS; ++i) a[i] = partials[i];
        return across(fold(a, op), op, commutes);
    }
    __device__ float sum(const float (&partials)[ELEMENTS]) {
        return reduce(partials, SumOp(), true);
    }
    __device__ float max(const float (&partials)[ELEMENTS]) {
        int key = order_key(partials[0]);
#pragma unroll
        for (u32 i = 1; i < ELEMENTS; ++i) key = ::max(key, order_key(partials[i]));
        key = __reduce_max_sync(FULL_WARP, key);
        int* keys = (int*)next() + T;  // past the partials a literal tree would use
        if (threadIdx.x % WARP == 0) keys[threadIdx.x / WARP] = key;
        barrier();
        key = keys[0];
#pragma unroll
        for (u32 w = 1; w < WARPS; ++w) key = ::max(key, keys[w]);
        const float m = from_order_key(key);
        if (m != 0.0f) return m;  // uniform: every lane holds the same key
        return reduce(partials, MaxOp(), false);  // a zero: whose sign the order decides
    }
};

// AdamW on a thread's E elements (adamw_element's operations and bits, p_i = e_i / s
// first), each division and root stage issued for all elements together. Elements past
// V are computed too (their values are never stored or reduced) but never force the
// slow path.
template <bool CORPUS, u32 E>
static __device__ __forceinline__ void adamw_together(
        const FusedArgs& a, const AdamStep& step, const float (&e)[E], float s,
        const u32 (&j)[E], const bool (&inside)[E], u32 target, float weight_sum,
        const float (&t)[E], float (&w)[E], float (&m)[E], float (&v)[E]) {
    // The range tests combine with & rather than &&: no branch between elements.
    float x[E], y[E];
    bool fast = moderate(s);
#pragma unroll
    for (u32 i = 0; i < E; ++i) {
        x[i] = quotient_fast(e[i], s);
        fast &= !inside[i] | moderate(e[i]);
    }
    if (!fast) {
#pragma unroll
        for (u32 i = 0; i < E; ++i) x[i] = dvd(e[i], s);
    }
    fast = true;
#pragma unroll
    for (u32 i = 0; i < E; ++i) {  // x: p_i, then y: sqrt(v_i)
        const float g = gradient<CORPUS>(a, x[i], j[i], target, weight_sum, t[i]);
        m[i] = add(mul(m[i], step.beta1), mul(step.one_minus_beta1, g));
        v[i] = add(mul(v[i], step.beta2), mul(mul(g, g), step.one_minus_beta2));
        y[i] = root_fast(v[i]);
        fast &= !inside[i] | root_fast_applies(v[i]);
    }
    if (!fast) {
#pragma unroll
        for (u32 i = 0; i < E; ++i) y[i] = __fsqrt_rn(v[i]);
    }
    fast = true;
#pragma unroll
    for (u32 i = 0; i < E; ++i) {  // x: step_size m_i, y: sqrt(v_i) + eps_hat, then the quotient
        const float numerator = mul(step.step_size, m[i]);
        y[i] = add(y[i], step.eps_hat);
        fast &= !inside[i] | (moderate(numerator) & moderate(y[i]));
        x[i] = quotient_fast(numerator, y[i]);
    }
    if (!fast) {
#pragma unroll
        for (u32 i = 0; i < E; ++i) x[i] = dvd(mul(step.step_size, m[i]), y[i]);
    }
#pragma unroll
    for (u32 i = 0; i < E; ++i) w[i] = sub(mul(w[i], step.decay), x[i]);
}

// One row of V <= 256 on T = 128 threads. FULL: V == 256, so no element needs a bounds
// test.
template <bool CORPUS, bool FULL>
static __device__ void fused_small(const FusedArgs& a, float (*buffers)[LANES],
                                   float (*scalar_buffers)[LANES]) {
    constexpr u32 T = 128u;  // threads per row
    constexpr u32 E = LANES / T;  // elements per thread
    if (threadIdx.x >= T) return;  // never at a barrier: the others count T
    NarrowTrees<T> trees{buffers, 0u};
    StagedScalars scalars{scalar_buffers[0], T};
    const u64 base = (u64)blockIdx.x * a.vocab;
    u32 j[E];
    bool inside[E];
    float w[E], m[E], v[E], t[E], e[E];
#pragma unroll
    for (u32 i = 0; i < E; ++i) {
        j[i] = threadIdx.x + T * i;
        inside[i] = FULL || j[i] < a.vocab;
        w[i] = m[i] = v[i] = t[i] = e[i] = 0.0f;
        if (inside[i]) {
            w[i] = a.parameters[base + j[i]];
            m[i] = a.first_moment[base + j[i]];
            v[i] = a.second_moment[base + j[i]];
            if (CORPUS) t[i] = a.weights[base + j[i]];
        }
    }
    float partial[E];
    float weight_sum = 0.0f;
    if (CORPUS) {
#pragma unroll
        for (u32 i = 0; i < E; ++i) partial[i] = add(0.0f, t[i]);  // t is +0 past V
        weight_sum = trees.sum(partial);
    }
    const u32 target = CORPUS ? 0u : a.targets[blockIdx.x];

    // Row max, e_i, and the row sum s of the current w.
    auto exponentials = [&](float& row_max) {
#pragma unroll
        for (u32 i = 0; i < E; ++i) partial[i] = max_partial(w[i], inside[i]);
        row_max = trees.max(partial);
#pragma unroll
        for (u32 i = 0; i < E; ++i) {
            e[i] = bob_exp2(exponent(w[i], row_max, a.log2e));
            partial[i] = inside[i] ? add(0.0f, e[i]) : 0.0f;
        }
        return trees.sum(partial);
    };

    for (u32 k = 0; k < a.updates; ++k) {
        scalars.stage(a, k);
        float row_max;
        const float s = exponentials(row_max);
        const AdamStep step = scalars.step(a, k);  // after the max's barrier
        adamw_together<CORPUS, E>(a, step, e, s, j, inside, target, weight_sum, t, w, m, v);
    }

    if (a.finish) {
        float row_max;
        const float s = exponentials(row_max);
        const float big_l = bob_log2(s);
#pragma unroll
        for (u32 i = 0; i < E; ++i) {
            partial[i] = 0.0f;
            if (inside[i]) {
                partial[i] = finish_element<CORPUS>(a, base, e[i], s, big_l, w[i], row_max, j[i],
                                                    target, weight_sum, t[i]);
            }
        }
        if (CORPUS) {
            const float total = trees.sum(partial);
            if (threadIdx.x == 0) a.loss[blockIdx.x] = canonical(mul(a.ln2, total));
        } else if (target >= a.vocab && threadIdx.x == 0) {
            a.loss[blockIdx.x] = f32(CANONICAL_NAN);
        }
    }
#pragma unroll
    for (u32 i = 0; i < E; ++i) {
        if (inside[i]) {
            a.parameters[base + j[i]] = canonical(w[i]);
            a.first_moment[base + j[i]] = canonical(m[i]);
            a.second_moment[base + j[i]] = canonical(v[i]);
        }
    }
}

// A small row: full (V = 256, no bounds tests) or not.
template <bool CORPUS>
static __device__ void fused_small_row(const FusedArgs& a, float (*buffers)[LANES],
                                       float (*scalar_buffers)[LANES]) {
    if (a.vocab == LANES) {
        fused_small<CORPUS, true>(a, buffers, scalar_buffers);
    } else {
        fused_small<CORPUS, false>(a, buffers, scalar_buffers);
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

// -- streaming with vector loads (rows with V % 4 == 0) ------------------------------------
//
// Each thread moves quads: float4 loads and stores of four neighbouring elements. In round
// r, thread (warp u, lane i of the warp) takes the quad at
//     j = 1024 r + 256 (i / 8) + 32 u + 4 (i % 8),
// so warp u's quads of a round are exactly the elements 1024 r + 256 n + 32 u + k (n < 4,
// k < 32): those the tree's lanes 32 u + k take, in their own order n. A lane-order fold
// (the row sum, the corpus weight sum) therefore needs only its warp: the warp stages its
// values in shared memory, __syncwarp, and tree lane 32 u + k folds its four in order,
// continuing its running partial from round to round; no block barrier until the tree.
// Every pass uses this one mapping, so a thread reads back only the global and kept
// values it wrote itself. A thread issues the loads of VECTOR_DEPTH rounds (UPDATE_DEPTH
// in the update pass) before using any: the memory parallelism the scalar path lacks.
// The max, whose value any order gives, is an integer max of order keys (as fused_small
// and TallRow::max), falling back to the literal lane-order max when it is a zero. The
// update runs element by element, each division and root behind its own slow-path branch.
#define VECTOR_DEPTH 4u  // rounds of loads in flight per thread in the max and sum passes
#define UPDATE_DEPTH 1u  // the same in the update pass (w, m, v and corpus t per round)
#define ROUND (4u * LANES)  // elements per round: one quad per thread
#define QUADS_PER_WARP WARP  // a warp's staged values of one round: 32 quads

// -- quads: the stream and held kernels' float4 loads and stores --------------------------

// Component c of a quad (c a constant once unrolled: no local memory).
static __device__ __forceinline__ float& part(float4& q, u32 c) {
    return c == 0u ? q.x : c == 1u ? q.y : c == 2u ? q.z : q.w;
}
static __device__ __forceinline__ float part(const float4& q, u32 c) {
    return c == 0u ? q.x : c == 1u ? q.y : c == 2u ? q.z : q.w;
}

// Quads are loaded and stored without cache hints.
static __device__ __forceinline__ float4 load_quad(const float* p) { return *(const float4*)p; }

static __device__ __forceinline__ void store_quad(float* p, float4 q) { *(float4*)p = q; }

static __device__ __forceinline__ float4 exponentials_of(float4 x, float m, float log2e) {
    return float4{bob_exp2(exponent(x.x, m, log2e)), bob_exp2(exponent(x.y, m, log2e)),
                  bob_exp2(exponent(x.z, m, log2e)), bob_exp2(exponent(x.w, m, log2e))};
}

static __device__ __forceinline__ float4 canonical_quad(float4 q) {
    return float4{canonical(q.x), canonical(q.y), canonical(q.z), canonical(q.w)};
}

// A round lies wholly inside kept or wholly past it, so a quad is all kept or none.
static_assert(KEPT_EXPONENTIALS % ROUND == 0, "KEPT_EXPONENTIALS must be a multiple of 1024");

// The offset in its round of this thread's quad (the mapping above).
static __device__ __forceinline__ u32 quad_offset() {
    const u32 i = threadIdx.x % WARP, u = threadIdx.x / WARP;
    return LANES * (i / 8u) + WARP * u + 4u * (i % 8u);
}

static __device__ __forceinline__ u32 round_count(u32 vocab) {
    return (vocab + ROUND - 1u) / ROUND;
}


// Row max of w: each thread's select_max over its quads (any order gives the value), the
// block's integer max of order keys, and the literal tree when that max is a zero.
static __device__ float vector_max(const FusedArgs& a, const float* w, Lanes& lanes) {
    const u32 offset = quad_offset(), rounds = round_count(a.vocab);
    float held = f32(NEG_INF);
    for (u32 first = 0; first < rounds; first += VECTOR_DEPTH) {
        float4 x[VECTOR_DEPTH];
#pragma unroll
        for (u32 d = 0; d < VECTOR_DEPTH; ++d) {
            const u32 j = ROUND * (first + d) + offset;
            if (j < a.vocab) x[d] = load_quad(w + j);
        }
#pragma unroll
        for (u32 d = 0; d < VECTOR_DEPTH; ++d) {
            if (ROUND * (first + d) + offset < a.vocab) {
#pragma unroll
                for (u32 c = 0; c < 4u; ++c) held = select_max(held, part(x[d], c));
            }
        }
    }
    int* keys = (int*)lanes.next();  // a tree buffer: the same barrier discipline
    const int key = __reduce_max_sync(FULL_WARP, order_key(held));  // held is never NaN
    if (threadIdx.x % WARP == 0) keys[threadIdx.x / WARP] = key;
    __syncthreads();  // also: the update pass's stores before the literal max's loads
    const int best = __reduce_max_sync(FULL_WARP, keys[threadIdx.x % (LANES / WARP)]);
    const float m = from_order_key(best);
    if (m != 0.0f) return m;  // uniform: every warp reduced the same keys
    return streaming_max(a, w, lanes);  // a zero: its sign is the lane order's
}

// What a lane-order fold sums: the row's exponentials e_j = exp2((w_j - m) log2e), or
// the values themselves (corpus weights).
struct RowSource {
    const float* w;
    bool exponentials;  // uniform
    float m, log2e;
    __device__ float4 value(float4 x) const {
        return exponentials ? exponentials_of(x, m, log2e) : x;
    }
};

// Lane l's partial l of a row sum: 0.0f + f_l + f_{l+256} + ..., in that order, f_j the
// source's value of element j. Rounds inside KEPT_EXPONENTIALS stage their values in
// `kept` (at their elements, where the update pass finds them), later rounds in the
// warp's 32 quads of `staged`.
static __device__ float lane_partial(const FusedArgs& a, const RowSource& source, float* kept,
                                     float4* staged) {
    const u32 offset = quad_offset(), rounds = round_count(a.vocab);
    const u32 i = threadIdx.x % WARP;
    float4* mine = staged + QUADS_PER_WARP * (threadIdx.x / WARP);
    const float* warp_values = (const float*)mine;
    float partial = 0.0f;
    for (u32 first = 0; first < rounds; first += VECTOR_DEPTH) {
        float4 x[VECTOR_DEPTH];
#pragma unroll
        for (u32 d = 0; d < VECTOR_DEPTH; ++d) {
            const u32 j = ROUND * (first + d) + offset;
            if (j < a.vocab) x[d] = load_quad(source.w + j);
        }
#pragma unroll
        for (u32 d = 0; d < VECTOR_DEPTH; ++d) {
            const u32 start = ROUND * (first + d);  // uniform
            if (start >= a.vocab) break;
            const bool in_kept = start < KEPT_EXPONENTIALS;
            if (start + offset < a.vocab) {
                const float4 f = source.value(x[d]);
                if (in_kept) {
                    *(float4*)(kept + start + offset) = f;
                } else {
                    mine[i] = f;  // values 32 n + k of the warp: tree lane 32 u + k's n-th
                }
            }
            __syncwarp();
#pragma unroll
            for (u32 n = 0; n < 4u; ++n) {
                const u32 j = start + LANES * n + threadIdx.x;
                if (j < a.vocab) {
                    partial = add(partial, in_kept ? kept[j] : warp_values[WARP * n + i]);
                }
            }
            __syncwarp();  // the folds read `mine` before the next round overwrites it
        }
    }
    return partial;
}

// The update pass: per element adamw_element's operations (p, gradient, AdamW, canonical
// stores) on quads; e_j from kept (this thread staged the quad) or computed again.
template <bool CORPUS>
static __device__ void vector_update(const FusedArgs& a, u64 base, const float* kept,
                                     float row_max, float s, const AdamStep& step, u32 target,
                                     float weight_sum) {
    float* w = a.parameters + base;
    float* m = a.first_moment + base;
    float* v = a.second_moment + base;
    const float* t = CORPUS ? a.weights + base : nullptr;
    const u32 offset = quad_offset(), rounds = round_count(a.vocab);
    for (u32 first = 0; first < rounds; first += UPDATE_DEPTH) {
        float4 wq[UPDATE_DEPTH], mq[UPDATE_DEPTH], vq[UPDATE_DEPTH], tq[UPDATE_DEPTH];
#pragma unroll
        for (u32 d = 0; d < UPDATE_DEPTH; ++d) {
            const u32 j = ROUND * (first + d) + offset;
            if (j < a.vocab) {
                wq[d] = load_quad(w + j);
                mq[d] = load_quad(m + j);
                vq[d] = load_quad(v + j);
                tq[d] = CORPUS ? load_quad(t + j) : float4{0.0f, 0.0f, 0.0f, 0.0f};
            }
        }
#pragma unroll
        for (u32 d = 0; d < UPDATE_DEPTH; ++d) {
            const u32 j = ROUND * (first + d) + offset;
            if (j < a.vocab) {
#pragma unroll
                for (u32 c = 0; c < 4u; ++c) {
                    const float p = dvd(exponential_again(a, kept, part(wq[d], c), j + c,
                                                          row_max), s);
                    const float g = gradient<CORPUS>(a, p, j + c, target, weight_sum,
                                                     part(tq[d], c));
                    adamw_element(step, g, part(wq[d], c), part(mq[d], c), part(vq[d], c));
                }
                store_quad(w + j, canonical_quad(wq[d]));
                store_quad(m + j, canonical_quad(mq[d]));
                store_quad(v + j, canonical_quad(vq[d]));
            }
        }
    }
}

// The finish on quads: gradients of the final w (float4 stores) and its loss, with the
// row max, row sum s and the first KEPT_EXPONENTIALS e_j in kept. Hard: the thread
// holding the target stores the loss. Corpus: the loss terms (L - z_j) T_j are folded in
// lane order as lane_partial folds, staged in the warp's quads of `staged`.
template <bool CORPUS>
static __device__ void vector_finish(const FusedArgs& a, Lanes& lanes, const float* kept,
                                     float4* staged, float row_max, float s, float weight_sum,
                                     u32 target) {
    const u64 base = (u64)blockIdx.x * a.vocab;
    const float* w = a.parameters + base;
    const float* t = CORPUS ? a.weights + base : nullptr;
    float* g = a.gradients + base;
    const float big_l = bob_log2(s);
    const u32 offset = quad_offset(), rounds = round_count(a.vocab);
    const u32 i = threadIdx.x % WARP;
    float4* mine = staged + QUADS_PER_WARP * (threadIdx.x / WARP);
    const float* warp_terms = (const float*)mine;
    // Half the rounds of the other passes: a round here holds a quad of gradients (and
    // corpus weights) too, and sm_86 spilled at VECTOR_DEPTH (hard, 8 bytes).
    constexpr u32 depth = VECTOR_DEPTH / 2u;
    RowLoss<CORPUS> loss{0.0f};
    for (u32 first = 0; first < rounds; first += depth) {
        float4 wq[depth], tq[depth];
#pragma unroll
        for (u32 d = 0; d < depth; ++d) {
            const u32 j = ROUND * (first + d) + offset;
            if (j < a.vocab) {
                wq[d] = load_quad(w + j);
                tq[d] = CORPUS ? load_quad(t + j) : float4{0.0f, 0.0f, 0.0f, 0.0f};
            }
        }
#pragma unroll
        for (u32 d = 0; d < depth; ++d) {
            const u32 start = ROUND * (first + d);  // uniform
            if (start >= a.vocab) break;
            const u32 j = start + offset;
            if (j < a.vocab) {
                float4 gq, terms;
#pragma unroll
                for (u32 c = 0; c < 4u; ++c) {
                    const float w_c = part(wq[d], c), t_c = part(tq[d], c);
                    const float p = dvd(exponential_again(a, kept, w_c, j + c, row_max), s);
                    part(gq, c) = canonical(gradient<CORPUS>(a, p, j + c, target, weight_sum,
                                                             t_c));
                    const float z = exponent(w_c, row_max, a.log2e);
                    if (CORPUS) {
                        part(terms, c) = mul(sub(big_l, z), t_c);
                    } else if (j + c == target) {
                        a.loss[blockIdx.x] = canonical(mul(a.ln2, sub(big_l, z)));
                    }
                }
                store_quad(g + j, gq);
                if (CORPUS) mine[i] = terms;
            }
            if (CORPUS) {
                __syncwarp();
#pragma unroll
                for (u32 n = 0; n < 4u; ++n) {
                    if (start + LANES * n + threadIdx.x < a.vocab) {
                        loss.partial = add(loss.partial, warp_terms[WARP * n + i]);
                    }
                }
                __syncwarp();  // the folds read `mine` before the next round overwrites it
            }
        }
    }
    loss.store(a, target, lanes);
}

template <bool CORPUS>
static __device__ void fused_streaming(const FusedArgs& a, Lanes& lanes, float* kept,
                                       StagedScalars& scalars) {
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
        scalars.stage(a, k);
        const float row_max = streaming_max(a, w, lanes);
        const float s = streaming_sum(a, w, row_max, kept, lanes);
        const AdamStep step = scalars.step(a, k);  // after the trees' barriers
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

// The streamed row on quads (V % 4 == 0). One loop runs the updates and then the
// finish's max and sum, and one fold serves the corpus weight sum and every row sum: each
// pass is inlined once (a smaller kernel, which ptxas fits in 64 registers, no spill).
template <bool CORPUS>
static __device__ void fused_streaming_vector(const FusedArgs& a, Lanes& lanes, float* kept,
                                              float4* staged, StagedScalars& scalars) {
    const u64 base = (u64)blockIdx.x * a.vocab;
    const float* w = a.parameters + base;
    const float weight_sum =
        CORPUS ? lanes.sum(lane_partial(a, RowSource{a.weights + base, false}, kept, staged))
               : 0.0f;
    const u32 target = CORPUS ? 0u : a.targets[blockIdx.x];
    const u32 passes = a.updates + (a.finish ? 1u : 0u);
    for (u32 k = 0; k < passes; ++k) {
        if (k < a.updates) scalars.stage(a, k);
        const float row_max = vector_max(a, w, lanes);
        const float s =
            lanes.sum(lane_partial(a, RowSource{w, true, row_max, a.log2e}, kept, staged));
        if (k == a.updates) {  // the finish: the trees' barriers ordered the quads' stores
            vector_finish<CORPUS>(a, lanes, kept, staged, row_max, s, weight_sum, target);
            break;
        }
        const AdamStep step = scalars.step(a, k);  // after the trees' barriers
        vector_update<CORPUS>(a, base, kept, row_max, s, step, target, weight_sum);
    }
}

// Shared memory of a fused block: the reductions' two buffers, the kept exponentials.
struct __align__(16) FusedShared {
    float buffers[2][LANES];
    float scalars[2][LANES];  // staged rows of adam_scalars (StagedScalars)
    float kept[KEPT_EXPONENTIALS];
};

// Rows up to SLOTS x 256 stay in registers; longer ones stream. Either path gives the
// same bits for any V, so a kernel is correct whatever V it is launched with.
template <bool CORPUS, u32 SLOTS>
static __device__ void fused_train(const FusedArgs& a, FusedShared& shared) {
    if (blockDim.x != LANES) __trap();
    if (blockIdx.x >= a.vocab) return;  // the whole block: no barrier is left waiting
    Lanes lanes{shared.buffers, 0u};
    StagedScalars scalars{shared.scalars[0], LANES};
    if (a.vocab <= LANES) {
        fused_small_row<CORPUS>(a, shared.buffers, shared.scalars);
    } else if (a.vocab <= SLOTS * LANES) {
        fused_resident<CORPUS, SLOTS>(a, lanes, scalars);
    } else {
        fused_streaming<CORPUS>(a, lanes, shared.kept, scalars);
    }
}

extern "C" __global__ FUSED_BOUNDS void bob_fused_train_hard(float* parameters, float* first_moment,
                                                float* second_moment, float* gradients,
                                                const u32* targets, float* loss,
                                                const float* adam_scalars, float log2e,
                                                float ln2, float inverse_rows, u32 vocab,
                                                u32 updates, u32 finish) {
    wait_for_prerequisites();
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
    wait_for_prerequisites();
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
    wait_for_prerequisites();
    __shared__ FusedShared shared;
    const FusedArgs a{parameters, first_moment, second_moment, gradients, targets, nullptr,
                      loss, adam_scalars, log2e, ln2, inverse_rows, vocab, updates, finish};
    fused_train<false, WIDE_SLOTS>(a, shared);
}

extern "C" __global__ WIDE_BOUNDS void bob_fused_train_wide_corpus(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const float* weights, float* loss, const float* adam_scalars, float log2e, float ln2,
        u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    __shared__ FusedShared shared;
    const FusedArgs a{parameters, first_moment, second_moment, gradients, nullptr, weights,
                      loss, adam_scalars, log2e, ln2, 0.0f, vocab, updates, finish};
    fused_train<true, WIDE_SLOTS>(a, shared);
}

// -- stream: rows with V % 4 == 0 streamed on quads ---------------------------------------
//
// The narrow kernels' streaming path on float4 loads and stores (fused_streaming_vector),
// in kernels of their own: beside the resident and small paths in one 64-register kernel,
// ptxas spilled (the slow paths of division and square root are subroutines every call
// site shares), and a kernel here may not spill.
#define STREAM_BOUNDS __launch_bounds__(LANES, 4)  // 64 registers: 4 blocks of 256 per SM

struct __align__(16) StreamShared {
    float buffers[2][LANES];
    float scalars[2][LANES];  // StagedScalars
    float4 staged[LANES];  // each warp's 32 quads of a round (lane_partial)
    float kept[KEPT_EXPONENTIALS];  // at a 16-byte offset
};

template <bool CORPUS>
static __device__ void fused_train_stream(const FusedArgs& a) {
    __shared__ StreamShared shared;
    // Quads need 16-byte alignment: a row starts V floats after the last, and the
    // signature declares the tables' bases 16-byte aligned.
    if (blockDim.x != LANES || a.vocab % 4u != 0u) __trap();
    if (blockIdx.x >= a.vocab) return;  // the whole block: no barrier is left waiting
    Lanes lanes{shared.buffers, 0u};
    StagedScalars scalars{shared.scalars[0], LANES};
    fused_streaming_vector<CORPUS>(a, lanes, shared.kept, shared.staged, scalars);
}

extern "C" __global__ STREAM_BOUNDS void bob_fused_train_stream_hard(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const u32* targets, float* loss, const float* adam_scalars, float log2e, float ln2,
        float inverse_rows, u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    const FusedArgs a{parameters, first_moment, second_moment, gradients, targets, nullptr,
                      loss, adam_scalars, log2e, ln2, inverse_rows, vocab, updates, finish};
    fused_train_stream<false>(a);
}

extern "C" __global__ STREAM_BOUNDS void bob_fused_train_stream_corpus(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const float* weights, float* loss, const float* adam_scalars, float log2e, float ln2,
        u32 vocab, u32 updates, u32 finish) {
    wait_for_prerequisites();
    const FusedArgs a{parameters, first_moment, second_moment, gradients, nullptr, weights,
                      loss, adam_scalars, log2e, ln2, 0.0f, vocab, updates, finish};
    fused_train_stream<true>(a);
}

// -- tall: a block per row, the row on chip (V <= 8192): bob_tall.cuh ----------------------
//
// Included once per mode, each in a namespace of its own, so that each mode runs its own
// shape: hard rows on 1024 threads with unguarded arithmetic, corpus rows on 512 threads
// with the sum chain handed between halves in registers.
namespace tall_hard {
#define TALL_MODE_CORPUS 0
#include "bob_tall.cuh"
#undef TALL_MODE_CORPUS
}  // namespace tall_hard

namespace tall_corpus {
#define TALL_MODE_CORPUS 1
#include "bob_tall.cuh"
#undef TALL_MODE_CORPUS
}  // namespace tall_corpus

// -- held: a block per row past TALL_VOCAB, the row's w in shared memory: bob_held.cuh -----
#include "bob_held.cuh"

// -- cluster: a row past TALL_VOCAB held by a thread-block cluster for a launch: bob_cluster.cuh
#include "bob_cluster.cuh"

// -- the sparse corpus input: the scatter and the loss alone: bob_sparse.cuh -------------
#include "bob_sparse.cuh"

// -- collapsed tables: a rest class per row and its exception columns: bob_collapsed.cuh ----
#include "bob_collapsed.cuh"
