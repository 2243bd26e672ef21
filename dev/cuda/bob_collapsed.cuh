// Collapsed tables (docs/ARITHMETIC.md, "Collapsed tables"): included once, at the end of
// bob_kernels.cu, whose helpers it uses. The kernels of bob.kernels.collapsed.reference,
// bit for bit.
//
// A table of classes is f32[V + K]: class r < V is row r's rest (every column the row does
// not list), class V + i exception i. Row r's exceptions are i in [offsets[r],
// offsets[r + 1]) at columns[i], sorted; order[] lists each row's exceptions by lane of
// the reductions (column % 256), then column, so a lane's chain of exceptions is a
// contiguous run of it, in the order the chain meets them.
//
// A row is run by a team: a warp (a light row: lane t of the warp holds tree lanes t,
// t + 32, ..., t + 224) or, for a row of more than HEAVY_EXCEPTIONS exceptions, the whole
// block (thread t holds tree lane t). Every row sum replays the 256 lanes' chains: a lane
// with no exception holds the sum of its chain's rest values, the others runs of the rest
// between their exceptions, each run summed exactly by add_run; then the tree of section
// 6. exp2, the gradient and AdamW run once per class. Rows are independent: the light
// rows of a block run first, a warp each, then its heavy rows (see each_row).

namespace collapsed {  // the kernels' C names are unchanged: extern "C" ignores it

#define HEAVY_EXCEPTIONS 96u
// The training kernels at four blocks of LANES an SM (64 registers a thread, none spilled):
// a row's sums are serial chains, whose latency more resident warps hide.
#define COLLAPSED_BOUNDS __launch_bounds__(LANES, 4)
#define ROWS_PER_BLOCK (LANES / WARP)
#define NO_COLUMN 0xFFFFFFFFu
#define MANTISSA 0x007FFFFFu
#define IMPLICIT 0x00800000u
#define TWO_POW_24_INT 0x01000000u

static __device__ __forceinline__ bool finite(float x) {
    return (__float_as_uint(x) & POS_INF) != POS_INF;
}

static __device__ __forceinline__ bool negative_bit(float x) {
    return (__float_as_uint(x) >> 31) != 0u;
}

// acc plus n additions of x, each rounded to binary32 (bob.kernels.collapsed.runs.add_run):
// inside a binade a run of equal additions moves acc by one constant step, so m of them are
// one multiplication; the addition that leaves the binade, a tie from an odd multiple, and
// every addition of a zero, an infinity, a NaN or a negative value are done one at a time.
static __device__ float add_run(float acc, float x, u32 n) {
    while (n > 0) {
        if (!(finite(acc) && finite(x) && 0.0f < x && x < acc)) {
            acc = add(acc, x);
            --n;
            if (x == 0.0f || !(finite(acc) && finite(x))) return acc;  // fixed from here on
            continue;
        }
        const u32 bits = __float_as_uint(acc), x_bits = __float_as_uint(x);
        const u32 exponent = bits >> 23, x_exponent = x_bits >> 23;
        const u32 whole = (bits & MANTISSA) | (exponent ? IMPLICIT : 0u);
        const u32 x_whole = (x_bits & MANTISSA) | (x_exponent ? IMPLICIT : 0u);
        const u32 scale = exponent ? exponent : 1u;
        const u32 shift = scale - (x_exponent ? x_exponent : 1u);  // x < acc: >= 0
        if (shift > 25u) return acc;  // x is below half a spacing: acc never moves
        const u32 floor = x_whole >> shift;
        const u32 remainder = x_whole & ((1u << shift) - 1u);
        const u32 half = shift ? 1u << (shift - 1u) : 0u;
        const bool tie = shift && remainder == half;
        const u32 step = tie ? floor + (floor & 1u) : floor + (shift && remainder > half);
        if ((tie && (whole & 1u)) || whole + floor >= TWO_POW_24_INT) {
            acc = add(acc, x);  // a tie from an odd multiple, or the binade's last addition
            --n;
            continue;
        }
        if (step == 0u) return acc;
        const u32 count = min(n, (TWO_POW_24_INT - 1u - floor - whole) / step + 1u);
        n -= count;
        acc = __uint_as_float(((scale - 1u) << 23) + whole + count * step);
    }
    return acc;
}

struct Index {
    const u32* offsets;
    const u32* columns;
    const u32* order;
    u32 vocab;
};

struct Row {
    u32 r, first, last;  // row r's exceptions: [first, last)
    __device__ u32 count() const { return last - first; }
    __device__ bool rest(u32 vocab) const { return last - first < vocab; }
};

static __device__ __forceinline__ Row row_of(const Index& ix, u32 r) {
    return Row{r, ix.offsets[r], ix.offsets[r + 1]};
}

// The first k in [first, last) whose exception's lane is at least `lane` (order[] is sorted
// by lane within a row).
static __device__ u32 lane_begin(const Index& ix, const Row& row, u32 lane) {
    u32 low = row.first, high = row.last;
    while (low < high) {
        const u32 middle = low + (high - low) / 2u;
        if (ix.columns[ix.order[middle]] % LANES < lane) {
            low = middle + 1u;
        } else {
            high = middle;
        }
    }
    return low;
}

// Columns in tree lane l's chain: l, l + 256, ... below V.
static __device__ __forceinline__ u32 chain_length(u32 vocab, u32 lane) {
    return lane < vocab ? (vocab - lane + LANES - 1u) / LANES : 0u;
}

// A warp runs a light row.
struct WarpTeam {
    static constexpr u32 SIZE = WARP;
    static constexpr u32 HELD = LANES / WARP;
    __device__ u32 rank() const { return threadIdx.x % WARP; }
    __device__ bool any(bool p) const { return __any_sync(FULL_WARP, p); }
    __device__ bool all(bool p) const { return __all_sync(FULL_WARP, p); }
    // The tree of section 6 over the 256 lanes the warp holds (warp_tree's order).
    template <typename Op>
    __device__ float tree(float (&a)[HELD], Op op) const {
#pragma unroll
        for (u32 i = 0; i < 4; ++i) a[i] = op(a[i], a[i + 4]);  // s = 128
        a[0] = op(a[0], a[2]);  // s = 64
        a[1] = op(a[1], a[3]);
        float x = op(a[0], a[1]);  // s = 32
#pragma unroll
        for (u32 s = WARP / 2; s > 0; s >>= 1) x = op(x, __shfl_down_sync(FULL_WARP, x, s));
        return __shfl_sync(FULL_WARP, x, 0);
    }
    // A max in any order: the value is the order's for every maximum but a zero.
    __device__ float largest(float held) const {
#pragma unroll
        for (u32 s = WARP / 2; s > 0; s >>= 1) {
            held = select_max(held, __shfl_xor_sync(FULL_WARP, held, s));
        }
        return held;
    }
};

// The block runs a heavy row: thread t holds tree lane t.
struct BlockTeam {
    static constexpr u32 SIZE = LANES;
    static constexpr u32 HELD = 1;
    float* buffer;  // LANES floats of shared memory
    __device__ u32 rank() const { return threadIdx.x; }
    __device__ bool any(bool p) const { return __syncthreads_or(p); }
    __device__ bool all(bool p) const { return __syncthreads_and(p); }
    template <typename Op>
    __device__ float tree(float (&a)[HELD], Op op) const {
        const float total = ::tree(a[0], buffer, op);
        __syncthreads();  // the buffer may be written again
        return total;
    }
    __device__ float largest(float held) const {
        float a[HELD] = {held};
        return tree(a, MaxOp());
    }
};

// Each of a thread's tree lanes: where its exceptions lie in order[], and its chain length.
template <class Team>
struct ChainRanges {
    u32 begin[Team::HELD], end[Team::HELD], length[Team::HELD];

    __device__ ChainRanges(const Team& team, const Index& ix, const Row& row) {
#pragma unroll
        for (u32 j = 0; j < Team::HELD; ++j) {
            const u32 lane = team.rank() + Team::SIZE * j;
            length[j] = chain_length(ix.vocab, lane);
            if (row.count() == 0u) {
                begin[j] = end[j] = row.first;
            } else {
                begin[j] = lane_begin(ix, row, lane);
                end[j] = lane_begin(ix, row, lane + 1u);
            }
        }
    }
};

// The max of the expanded row in the order of section 6, exact over the classes: NaN is
// never taken (-inf for no candidate); a zero maximum takes the sign the literal order
// gives (each lane's first zero, then the select tree) where zeros of both signs exist.
template <class Team>
static __device__ float class_max(const Team& team, const float* w, const Index& ix,
                                  const Row& row, const ChainRanges<Team>& lanes) {
    const u32 vocab = ix.vocab;
    const bool rest = row.rest(vocab);
    float held = f32(NEG_INF);
    if (rest && team.rank() == 0) held = select_max(held, w[row.r]);
    for (u32 i = row.first + team.rank(); i < row.last; i += Team::SIZE) {
        held = select_max(held, w[vocab + i]);
    }
    const float m = team.largest(held);
    if (m != 0.0f) return m;
    bool negative = false, positive = false;
    if (rest && team.rank() == 0 && w[row.r] == 0.0f) {
        (negative_bit(w[row.r]) ? negative : positive) = true;
    }
    for (u32 i = row.first + team.rank(); i < row.last; i += Team::SIZE) {
        if (w[vocab + i] == 0.0f) (negative_bit(w[vocab + i]) ? negative : positive) = true;
    }
    negative = team.any(negative);
    positive = team.any(positive);
    if (!(negative && positive)) return negative ? -0.0f : 0.0f;
    const bool rest_zero = rest && w[row.r] == 0.0f;
    float a[Team::HELD];
#pragma unroll
    for (u32 j = 0; j < Team::HELD; ++j) {
        const u32 lane = team.rank() + Team::SIZE * j;
        u32 column = NO_COLUMN;
        float first = f32(NEG_INF);
        for (u32 k = lanes.begin[j]; k < lanes.end[j]; ++k) {  // the first exception zero
            const u32 i = ix.order[k];
            if (w[vocab + i] == 0.0f) {
                column = ix.columns[i];
                first = w[vocab + i];
                break;
            }
        }
        if (rest_zero) {  // the chain's first column that is no exception
            u32 position = 0;
            for (u32 k = lanes.begin[j]; k < lanes.end[j]; ++k) {
                if (ix.columns[ix.order[k]] / LANES != position) break;
                ++position;
            }
            if (position < lanes.length[j] && lane + LANES * position < column) {
                first = w[row.r];
            }
        }
        a[j] = first;
    }
    return team.tree(a, MaxOp());
}

// The sum of the expanded row in the order of section 6: the rest's value `rest` at every
// column that is no exception, value(i) at exception i's.
template <class Team, class Value>
static __device__ float class_sum(const Team& team, const Index& ix, const ChainRanges<Team>& lanes,
                                  float rest, Value value) {
    const u32 vocab = ix.vocab;
    const u32 short_length = vocab / LANES;  // lanes below V % 256 take one more
    const float run_short = add_run(0.0f, rest, short_length);
    const float run_long = add_run(run_short, rest, 1u);
    float a[Team::HELD];
#pragma unroll
    for (u32 j = 0; j < Team::HELD; ++j) {
        const u32 lane = team.rank() + Team::SIZE * j;
        float acc = lane < vocab % LANES ? run_long : run_short;
        if (lanes.begin[j] < lanes.end[j]) {
            acc = 0.0f;
            u32 next = 0;  // the chain position after the last one summed
            for (u32 k = lanes.begin[j]; k < lanes.end[j]; ++k) {
                const u32 i = ix.order[k];
                const u32 position = ix.columns[i] / LANES;
                acc = add(add_run(acc, rest, position - next), value(i));
                next = position + 1u;
            }
            acc = add_run(acc, rest, lanes.length[j] - next);
        }
        a[j] = acc;
    }
    return team.tree(a, SumOp());
}

// The exception index of (row, column), or NO_COLUMN where it is no exception.
static __device__ u32 find_exception(const Index& ix, const Row& row, u32 column) {
    u32 low = row.first, high = row.last;
    while (low < high) {
        const u32 middle = low + (high - low) / 2u;
        const u32 found = ix.columns[middle];
        if (found == column) return middle;
        if (found < column) {
            low = middle + 1u;
        } else {
            high = middle;
        }
    }
    return NO_COLUMN;
}

// What a row's loss-gradient needs besides its classes.
struct LossArgs {
    const u32* targets;  // hard targets, or
    const float* weights;  // the exceptions' corpus weights (the rest's is 0)
    float log2e, ln2, inverse_rows;
};

// Row r's loss and every class's gradient, hard targets (bob-loss-gradient on the expanded
// row). `target`: its exception, NO_COLUMN where the target is none (a NaN loss, no -1).
template <class Team>
static __device__ void hard_row(const Team& team, const Index& ix, const Row& row,
                                const ChainRanges<Team>& lanes, const float* w, float* gradients,
                                float* loss, const LossArgs& a, u32 target) {
    const u32 vocab = ix.vocab;
    const float m = class_max(team, w, ix, row, lanes);
    const float rest_e = bob_exp2(exponent(w[row.r], m, a.log2e));
    const float s = class_sum(team, ix, lanes, rest_e, [&](u32 i) {
        return bob_exp2(exponent(w[vocab + i], m, a.log2e));
    });
    if (team.rank() == 0) {
        gradients[row.r] = canonical(mul(dvd(rest_e, s), a.inverse_rows));
        float value = f32(CANONICAL_NAN);
        if (target != NO_COLUMN) {
            value = mul(a.ln2, sub(bob_log2(s), exponent(w[vocab + target], m, a.log2e)));
        }
        if (loss != nullptr) loss[row.r] = canonical(value);
    }
    for (u32 i = row.first + team.rank(); i < row.last; i += Team::SIZE) {
        const float p = dvd(bob_exp2(exponent(w[vocab + i], m, a.log2e)), s);
        const float g = i == target ? mul(sub(p, 1.0f), a.inverse_rows) : mul(p, a.inverse_rows);
        gradients[vocab + i] = canonical(g);
    }
}

// Whether every exception of the row has weight zero (of either sign). With every class's
// |w| at most 2^125 as well (`moderate_row`: then z = (w - m) log2e is finite) and a rest
// that stands for a column (so it joins the max: a rest standing for none may lie above it,
// its exponential inf and its gradient NaN), each gradient is +0 and the loss +0 whatever
// the row sums: rs = +0 and p in [0, 1], so
// rs p - T = +0; L - z is finite and >= 0, so every loss term is a zero and their sum +0.
template <class Team>
static __device__ bool weightless(const Team& team, const Row& row, const float* weights) {
    bool some = false;
    for (u32 i = row.first + team.rank(); i < row.last; i += Team::SIZE) {
        some |= weights[i] != 0.0f;
    }
    return !team.any(some);
}

#define MODERATE_BITS 0x7E000000u  // 2^125

template <class Team>
static __device__ bool moderate_row(const Team& team, const Index& ix, const Row& row,
                                    const float* w) {
    auto moderate = [](float x) { return (__float_as_uint(x) & 0x7FFFFFFFu) <= MODERATE_BITS; };
    bool fine = team.rank() != 0 || moderate(w[row.r]);
    for (u32 i = row.first + team.rank(); i < row.last; i += Team::SIZE) {
        fine &= moderate(w[ix.vocab + i]);
    }
    return team.all(fine);
}

// Row r's corpus loss (where `loss`) and every class's gradient (where `gradients`), with
// the row's weight sum `weight_sum` and whether its weights are all zero.
template <class Team>
static __device__ void corpus_row(const Team& team, const Index& ix, const Row& row,
                                  const ChainRanges<Team>& lanes, const float* w, float* gradients,
                                  float* loss, const LossArgs& a, float weight_sum,
                                  bool no_weight) {
    const u32 vocab = ix.vocab;
    if (no_weight && row.rest(vocab) && moderate_row(team, ix, row, w)) {
        if (team.rank() == 0) {
            if (gradients != nullptr) gradients[row.r] = 0.0f;
            if (loss != nullptr) loss[row.r] = 0.0f;
        }
        if (gradients != nullptr) {
            for (u32 i = row.first + team.rank(); i < row.last; i += Team::SIZE) {
                gradients[vocab + i] = 0.0f;
            }
        }
        return;
    }
    const float m = class_max(team, w, ix, row, lanes);
    const float rest_e = bob_exp2(exponent(w[row.r], m, a.log2e));
    const float s = class_sum(team, ix, lanes, rest_e, [&](u32 i) {
        return bob_exp2(exponent(w[vocab + i], m, a.log2e));
    });
    if (loss != nullptr) {
        const float big_l = bob_log2(s);
        const float rest_term = mul(sub(big_l, exponent(w[row.r], m, a.log2e)), 0.0f);
        const float total = class_sum(team, ix, lanes, rest_term, [&](u32 i) {
            return mul(sub(big_l, exponent(w[vocab + i], m, a.log2e)), a.weights[i]);
        });
        if (team.rank() == 0) loss[row.r] = canonical(mul(a.ln2, total));
    }
    if (gradients == nullptr) return;
    if (team.rank() == 0) {
        gradients[row.r] = canonical(sub(mul(dvd(rest_e, s), weight_sum), 0.0f));
    }
    for (u32 i = row.first + team.rank(); i < row.last; i += Team::SIZE) {
        const float p = dvd(bob_exp2(exponent(w[vocab + i], m, a.log2e)), s);
        gradients[vocab + i] = canonical(sub(mul(p, weight_sum), a.weights[i]));
    }
}

template <class Team>
static __device__ float weight_sum_of(const Team& team, const Index& ix,
                                      const ChainRanges<Team>& lanes, const float* weights) {
    return class_sum(team, ix, lanes, 0.0f, [&](u32 i) { return weights[i]; });
}

// One row's loss-gradient (or, corpus mode without `gradients`, its loss alone).
template <class Team>
static __device__ void loss_row(const Team& team, const Index& ix, const Row& row,
                                const float* w, float* gradients, float* loss,
                                const LossArgs& a) {
    const ChainRanges<Team> lanes(team, ix, row);
    if (a.targets != nullptr) {
        const u32 t = a.targets[row.r];
        const u32 target = t < ix.vocab ? find_exception(ix, row, t) : NO_COLUMN;
        hard_row(team, ix, row, lanes, w, gradients, loss, a, target);
    } else {
        corpus_row(team, ix, row, lanes, w, gradients, loss, a,
                   weight_sum_of(team, ix, lanes, a.weights),
                   weightless(team, row, a.weights));
    }
}

// The work of one row for each_row, as functors with a member template rather than generic
// lambdas: NVRTC 13.0 takes a generic lambda in a kernel for a host function.
struct LossOfRow {
    const Index& ix;
    const float* parameters;
    float* gradients;
    float* loss;
    const LossArgs& a;
    template <class Team>
    __device__ void operator()(const Team& team, const Row& row) const {
        loss_row(team, ix, row, parameters, gradients, loss, a);
    }
};

// The rows of block b: the light ones of rows 8b .. 8b + 7, a warp each (neighbours, whose
// costs are alike), then the heavy ones of rows b, b + G, b + 2G, ... (G blocks), the whole
// block, one after another: a token corpus's heavy rows are its frequent, low ids, which
// taken side by side would queue in a few blocks. The condition is the same in every
// thread, so the barriers are uniform.
template <class Work>
static __device__ void each_row(const Index& ix, float* buffer, Work work) {
    const u32 mine = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    if (mine < ix.vocab) {
        const Row row = row_of(ix, mine);
        if (row.count() <= HEAVY_EXCEPTIONS) work(WarpTeam{}, row);
    }
    for (u32 r = blockIdx.x; r < ix.vocab; r += gridDim.x) {
        const Row row = row_of(ix, r);
        if (row.count() > HEAVY_EXCEPTIONS) {
            __syncthreads();
            work(BlockTeam{buffer}, row);
        }
    }
}

extern "C" __global__ COLLAPSED_BOUNDS void bob_collapsed_loss_gradient(
        const float* parameters, float* gradients, const u32* targets, float* loss,
        const u32* row_offsets, const u32* columns, const u32* lane_order, float log2e, float ln2,
        float inverse_rows, u32 vocab, u32 exceptions, u32 classes, u32 offsets) {
    wait_for_prerequisites();
    __shared__ float buffer[LANES];
    if (blockDim.x != LANES) __trap();
    const Index ix{row_offsets, columns, lane_order, vocab};
    const LossArgs a{targets, nullptr, log2e, ln2, inverse_rows};
    each_row(ix, buffer, LossOfRow{ix, parameters, gradients, loss, a});
}

extern "C" __global__ COLLAPSED_BOUNDS void bob_collapsed_loss_gradient_corpus(
        const float* parameters, float* gradients, const float* weights, float* loss,
        const u32* row_offsets, const u32* columns, const u32* lane_order, float log2e, float ln2,
        u32 vocab, u32 exceptions, u32 classes, u32 offsets) {
    wait_for_prerequisites();
    __shared__ float buffer[LANES];
    if (blockDim.x != LANES) __trap();
    const Index ix{row_offsets, columns, lane_order, vocab};
    const LossArgs a{nullptr, weights, log2e, ln2, 0.0f};
    each_row(ix, buffer, LossOfRow{ix, parameters, gradients, loss, a});
}

// The corpus loss alone (validation): bob_collapsed_loss_gradient_corpus's row losses.
extern "C" __global__ void bob_collapsed_loss_corpus(
        const float* parameters, const float* weights, float* loss, const u32* row_offsets, const
        u32* columns, const u32* lane_order,
        float log2e, float ln2, u32 vocab, u32 exceptions, u32 classes, u32 offsets) {
    wait_for_prerequisites();
    __shared__ float buffer[LANES];
    if (blockDim.x != LANES) __trap();
    const Index ix{row_offsets, columns, lane_order, vocab};
    const LossArgs a{nullptr, weights, log2e, ln2, 0.0f};
    each_row(ix, buffer, LossOfRow{ix, parameters, nullptr, loss, a});
}

// AdamW on every class of a row (bob_adamw's operations), with update k's scalars.
template <class Team>
static __device__ void adamw_row(const Team& team, const Index& ix, const Row& row,
                                 const AdamStep& step, float* w, const float* g, float* m,
                                 float* v) {
    auto one = [&](u32 c) {
        float wc = w[c], mc = m[c], vc = v[c];
        adamw_element(step, g[c], wc, mc, vc);
        w[c] = canonical(wc);
        m[c] = canonical(mc);
        v[c] = canonical(vc);
    };
    if (team.rank() == 0) one(row.r);
    for (u32 i = row.first + team.rank(); i < row.last; i += Team::SIZE) one(ix.vocab + i);
}

// `updates` updates of one row (its gradient, then AdamW with row k of adam_scalars); with
// `finish` the loss and gradient of the result. The gradients hold each update's gradient
// between its two steps, so the region's footprint on them is the whole table.
template <bool CORPUS, class Team>
static __device__ void fused_row(const Team& team, const Index& ix, const Row& row,
                                 float* parameters, float* first_moment, float* second_moment,
                                 float* gradients, float* loss, const float* adam_scalars,
                                 const LossArgs& a, u32 updates, u32 finish) {
    const ChainRanges<Team> lanes(team, ix, row);
    u32 target = NO_COLUMN;
    float weight_sum = 0.0f;
    bool no_weight = false;
    if (CORPUS) {
        weight_sum = weight_sum_of(team, ix, lanes, a.weights);  // the weights never change
        no_weight = weightless(team, row, a.weights);
    } else {
        const u32 t = a.targets[row.r];
        target = t < ix.vocab ? find_exception(ix, row, t) : NO_COLUMN;
    }
    for (u32 k = 0; k <= updates; ++k) {
        const bool last = k == updates;
        if (last && !finish) break;
        float* row_loss = last ? loss : nullptr;
        if (CORPUS) {
            corpus_row(team, ix, row, lanes, parameters, gradients, row_loss, a, weight_sum,
                       no_weight);
        } else {
            hard_row(team, ix, row, lanes, parameters, gradients, row_loss, a, target);
        }
        if (last) break;
        // A class's gradient and its AdamW are the same thread's; the next update's max
        // and sums read every class of the row: the team's writes made visible.
        adamw_row(team, ix, row, adam_step(adam_scalars + ADAM_STRIDE * k), parameters,
                  gradients, first_moment, second_moment);
        __syncwarp();
        if (Team::SIZE == LANES) __syncthreads();
    }
}

// fused_row for each_row (a functor, as LossOfRow is).
template <bool CORPUS>
struct FusedRows {
    const Index& ix;
    float* parameters;
    float* first_moment;
    float* second_moment;
    float* gradients;
    float* loss;
    const float* adam_scalars;
    const LossArgs& a;
    u32 updates;
    u32 finish;
    template <class Team>
    __device__ void operator()(const Team& team, const Row& row) const {
        fused_row<CORPUS>(team, ix, row, parameters, first_moment, second_moment, gradients,
                          loss, adam_scalars, a, updates, finish);
    }
};

// Every row's updates, a row's all before the next's (rows are independent).
template <bool CORPUS>
static __device__ void collapsed_fused(const Index& ix, float* buffer, float* parameters,
                                       float* first_moment, float* second_moment,
                                       float* gradients, float* loss, const float* adam_scalars,
                                       const LossArgs& a, u32 updates, u32 finish) {
    each_row(ix, buffer, FusedRows<CORPUS>{ix, parameters, first_moment, second_moment,
                                           gradients, loss, adam_scalars, a, updates, finish});
}

extern "C" __global__ COLLAPSED_BOUNDS void bob_collapsed_fused_train(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const u32* targets, float* loss, const float* adam_scalars, const u32* row_offsets, const
        u32* columns, const u32* lane_order,
        float log2e, float ln2, float inverse_rows, u32 vocab, u32 exceptions, u32 classes, u32
        offsets, u32 updates, u32 finish) {
    wait_for_prerequisites();
    __shared__ float buffer[LANES];
    if (blockDim.x != LANES) __trap();
    const Index ix{row_offsets, columns, lane_order, vocab};
    const LossArgs a{targets, nullptr, log2e, ln2, inverse_rows};
    collapsed_fused<false>(ix, buffer, parameters, first_moment, second_moment, gradients, loss,
                           adam_scalars, a, updates, finish);
}

extern "C" __global__ COLLAPSED_BOUNDS void bob_collapsed_fused_train_corpus(
        float* parameters, float* first_moment, float* second_moment, float* gradients,
        const float* weights, float* loss, const float* adam_scalars, const u32* row_offsets, const
        u32* columns, const u32* lane_order,
        float log2e, float ln2, u32 vocab, u32 exceptions, u32 classes, u32 offsets, u32 updates,
        u32 finish) {
    wait_for_prerequisites();
    __shared__ float buffer[LANES];
    if (blockDim.x != LANES) __trap();
    const Index ix{row_offsets, columns, lane_order, vocab};
    const LossArgs a{nullptr, weights, log2e, ln2, 0.0f};
    collapsed_fused<true>(ix, buffer, parameters, first_moment, second_moment, gradients, loss,
                          adam_scalars, a, updates, finish);
}

// logits = the expanded row prompt[0]: the rest's bits everywhere, then the exceptions'; a
// prompt >= V (never admitted by the host) gives a row of NaN. One block.
extern "C" __global__ void bob_collapsed_gather(
        float* logits, const u32* prompt, const float* parameters, const u32* row_offsets, const
        u32* columns, const u32* lane_order,
        u32 vocab, u32 exceptions, u32 classes, u32 offsets) {
    wait_for_prerequisites();
    const u32 r = prompt[0];
    u32* out = (u32*)logits;
    const u32* classes_bits = (const u32*)parameters;
    const u32 rest = r < vocab ? classes_bits[r] : CANONICAL_NAN;
    for (u32 j = threadIdx.x; j < vocab; j += blockDim.x) out[j] = rest;
    if (r >= vocab) return;
    __syncthreads();  // the exceptions' bits land over the rest's
    for (u32 i = row_offsets[r] + threadIdx.x; i < row_offsets[r + 1]; i += blockDim.x) {
        out[columns[i]] = classes_bits[vocab + i];
    }
}

// weights[i] = values[j] (bits) where key j (row * V + column) is exception i, for j < count;
// a key that is no exception is not written. Keys are distinct: no two threads write one
// slot. Grid-stride, a binary search in the key's row.
extern "C" __global__ void bob_collapsed_scatter(
        float* weights, const u64* keys, const float* values, const u32* row_offsets,
        const u32* columns, u32 count, u32 vocab, u32 exceptions, u32 classes, u32 offsets) {
    wait_for_prerequisites();
    const Index ix{row_offsets, columns, nullptr, vocab};
    u32* slots = (u32*)weights;
    const u32* value_bits = (const u32*)values;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < count; j += stride) {
        const u64 key = keys[j];
        const u64 r = key / vocab;
        if (r >= vocab) continue;
        const u32 i = find_exception(ix, row_of(ix, (u32)r), (u32)(key - r * vocab));
        if (i != NO_COLUMN) slots[i] = value_bits[j];
    }
}

// health[t] += the non-finite classes of table t: bob_health's count over V + K classes.
extern "C" __global__ void bob_collapsed_health(const float* parameters,
                                                const float* first_moment,
                                                const float* second_moment, u64* health,
                                                u32 classes) {
    wait_for_prerequisites();
    count_non_finite(parameters, first_moment, second_moment, health, classes);
}

}  // namespace collapsed
