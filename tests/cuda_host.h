// Bob's CUDA kernels compiled as C++ for the host: a test double of the GPU's execution
// model, enough of it to run the shipped kernel source on the CPU (tests/cuda_host.py).
//
// A block's threads are coroutines on one OS thread, run in turn by index
// until each ends or reaches a barrier or a warp exchange; blocks run one after the other.
// That is one of the interleavings a GPU may choose, so a kernel whose result depends on
// the interleaving is not proven by it, but every barrier, shuffle and shared-memory
// exchange the source writes happens as written. Arithmetic is binary32 on SSE with no
// contraction (-ffp-contract=off): __fadd_rn and friends are IEEE operations, as on the
// device. The PTX the source writes inline (rcp/rsqrt approximations, an FTZ multiply, a
// counted barrier, the dynamic shared size, cp.async's copies, made at once) is replaced
// by the functions below, or plain copies, before compiling (tests/cuda_host.py's PTX).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ucontext.h>
#include <vector>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// Shared memory: one copy for the block running now (blocks run one at a time).
#define __shared__ static

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};

namespace cuda_host {

constexpr size_t STACK_BYTES = 128 << 10;

// Switching between coroutines: on x86-64 a few instructions that save and restore the
// callee-saved registers and the stack pointer (ucontext's switch makes a system call for
// the signal mask, most of a block's time); elsewhere ucontext.
#if defined(__x86_64__)
extern "C" void bob_host_switch(void** save, void* load);
asm(R"(
    .text
    .globl bob_host_switch
    .type bob_host_switch, @function
bob_host_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size bob_host_switch, .-bob_host_switch
)");

struct Context {
    void* sp = nullptr;
};

// A context that starts `entry` (which never returns) on `stack` at its first switch.
inline void start(Context& context, char* stack, size_t bytes, void (*entry)()) {
    auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
    auto* frame = reinterpret_cast<uint64_t*>(top - 72);
    unsigned int mxcsr;
    unsigned short fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    frame[0] = mxcsr | (uint64_t(fpucw) << 32);
    for (int i = 1; i <= 6; ++i) frame[i] = 0;  // r15 .. rbp
    frame[7] = reinterpret_cast<uint64_t>(entry);  // where the switch returns to
    frame[8] = 0;  // entry's own return address: it never returns
    context.sp = frame;
}
inline void switch_to(Context& save, Context& load) { bob_host_switch(&save.sp, load.sp); }
constexpr bool ENTRY_RETURNS = false;
#else
struct Context {
    ucontext_t context;
};
inline Context* scheduler_context = nullptr;
inline void start(Context& context, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&context.context);
    context.context.uc_stack.ss_sp = stack;
    context.context.uc_stack.ss_size = bytes;
    context.context.uc_link = &scheduler_context->context;
    makecontext(&context.context, entry, 0);
}
inline void switch_to(Context& save, Context& load) {
    swapcontext(&save.context, &load.context);
}
constexpr bool ENTRY_RETURNS = true;
#endif

struct Thread {
    Context context;
    char* stack = nullptr;  // the launch's, STACK_BYTES for this thread index
    dim3 index;
    bool done = false;
    bool waiting = false;  // at a barrier or exchange not yet complete
};

struct Launch {
    dim3 grid, block, block_index;
    std::vector<Thread> threads;
    Context scheduler;
    unsigned int current = 0;
    // The block barrier (barrier 0): arrivals in this phase and the count that completes it.
    unsigned int arrived = 0;
    unsigned long long generation = 0;
    // __syncthreads_count/_or/_and: the predicates counted in this phase, and the last
    // completed phase's count and participants.
    unsigned int votes = 0, voted = 0, participants = 0;
    // Each warp's exchange: 32 words of 8 bytes, and its own phase.
    std::vector<unsigned long long> lanes;
    std::vector<unsigned int> warp_arrived;
    std::vector<unsigned long long> warp_generation;
    std::function<void()> body;
    std::vector<char> stacks;  // every thread's stack, made once per launch
    std::vector<float4> dynamic_shared;  // the launch's dynamic shared memory, per block
};

inline Launch* launch = nullptr;

inline unsigned int thread_count() { return launch->block.x * launch->block.y * launch->block.z; }
inline unsigned int live_threads() {
    unsigned int live = 0;
    for (auto& t : launch->threads) live += !t.done;
    return live;
}
inline unsigned int live_in_warp(unsigned int warp) {
    unsigned int live = 0;
    for (unsigned int i = 32 * warp; i < 32 * warp + 32 && i < launch->threads.size(); ++i)
        live += !launch->threads[i].done;
    return live;
}

inline void yield() {
    Thread& me = launch->threads[launch->current];
    switch_to(me.context, launch->scheduler);
}

// Block barrier 0 with a thread count: complete when `count` threads arrived (every live
// thread for __syncthreads).
inline void barrier(unsigned int count) {
    const unsigned long long phase = launch->generation;
    launch->arrived += 1;
    if (launch->arrived >= count) {
        launch->voted = launch->votes;
        launch->participants = launch->arrived;
        launch->votes = 0;
        launch->arrived = 0;
        launch->generation += 1;
        for (auto& t : launch->threads) t.waiting = false;
        return;
    }
    launch->threads[launch->current].waiting = true;
    while (launch->generation == phase) yield();
}

inline void warp_barrier() {
    const unsigned int warp = launch->current / 32;
    const unsigned long long phase = launch->warp_generation[warp];
    launch->warp_arrived[warp] += 1;
    if (launch->warp_arrived[warp] >= live_in_warp(warp)) {
        launch->warp_arrived[warp] = 0;
        launch->warp_generation[warp] += 1;
        for (unsigned int i = 32 * warp; i < 32 * warp + 32 && i < launch->threads.size(); ++i)
            launch->threads[i].waiting = false;
        return;
    }
    launch->threads[launch->current].waiting = true;
    while (launch->warp_generation[warp] == phase) yield();
}

inline void trampoline() {
    launch->body();
    launch->threads[launch->current].done = true;
    // A thread that ends no longer holds back its block's or its warp's barrier.
    const unsigned int warp = launch->current / 32;
    if (launch->arrived && launch->arrived >= live_threads()) {
        launch->voted = launch->votes;
        launch->participants = launch->arrived;
        launch->votes = 0;
        launch->arrived = 0;
        launch->generation += 1;
        for (auto& t : launch->threads) t.waiting = false;
    }
    if (launch->warp_arrived[warp] && launch->warp_arrived[warp] >= live_in_warp(warp)) {
        launch->warp_arrived[warp] = 0;
        launch->warp_generation[warp] += 1;
        for (unsigned int i = 32 * warp; i < 32 * warp + 32 && i < launch->threads.size(); ++i)
            launch->threads[i].waiting = false;
    }
}

inline void thread_entry() {
    trampoline();
    if (!ENTRY_RETURNS) {  // back to the scheduler, for good: it runs a done thread no more
        Thread& me = launch->threads[launch->current];
        switch_to(me.context, launch->scheduler);
    }
}

inline void run_block() {
    const unsigned int count = thread_count();
    if (launch->stacks.size() < count * STACK_BYTES) launch->stacks.resize(count * STACK_BYTES);
    launch->threads.assign(count, Thread());
    launch->arrived = 0;
    launch->lanes.assign(count + 32, 0);
    launch->warp_arrived.assign(count / 32 + 1, 0);
    launch->warp_generation.assign(count / 32 + 1, 0);
    for (unsigned int i = 0; i < count; ++i) {
        Thread& t = launch->threads[i];
        t.stack = launch->stacks.data() + i * STACK_BYTES;
        t.index.x = i % launch->block.x;
        t.index.y = i / launch->block.x % launch->block.y;
        t.index.z = i / (launch->block.x * launch->block.y);
        start(t.context, t.stack, STACK_BYTES, thread_entry);
    }
    for (;;) {
        // Threads waiting at a barrier or exchange not yet complete are passed over (its
        // completion clears their flag); a round with threads left and none to run is a
        // deadlock: a barrier some thread never reaches.
        bool live = false, ran = false;
        for (unsigned int i = 0; i < count; ++i) {
            Thread& t = launch->threads[i];
            if (t.done) continue;
            live = true;
            if (t.waiting) continue;
            ran = true;
            launch->current = i;
            switch_to(launch->scheduler, t.context);
        }
        if (!live) break;
        if (!ran) {
            std::fprintf(stderr, "cuda_host: block %u deadlocked at a barrier\n",
                         launch->block_index.x);
            std::abort();
        }
    }
}

inline void run(dim3 grid, dim3 block, unsigned int dynamic_shared_bytes,
                std::function<void()> body) {
    Launch state;
    state.dynamic_shared.assign((dynamic_shared_bytes + 15) / 16, float4{});
#if !defined(__x86_64__)
    scheduler_context = &state.scheduler;
#endif
    state.grid = grid;
    state.block = block;
    state.body = std::move(body);
    launch = &state;
    for (unsigned int z = 0; z < grid.z; ++z)
        for (unsigned int y = 0; y < grid.y; ++y)
            for (unsigned int x = 0; x < grid.x; ++x) {
                state.block_index = dim3{x, y, z};
                run_block();
            }
    launch = nullptr;
}

template <typename T>
inline T exchange(T value, unsigned int source_lane, bool in_range) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    const unsigned int me = launch->current;
    const unsigned int base = me / 32 * 32;
    unsigned long long word = 0;
    std::memcpy(&word, &value, sizeof(T));
    launch->lanes[me] = word;
    warp_barrier();
    T result = value;
    if (in_range) std::memcpy(&result, &launch->lanes[base + source_lane], sizeof(T));
    warp_barrier();
    return result;
}

}  // namespace cuda_host

// The built-in variables, for the thread running now.
#define threadIdx (cuda_host::launch->threads[cuda_host::launch->current].index)
#define blockIdx (cuda_host::launch->block_index)
#define blockDim (cuda_host::launch->block)
#define gridDim (cuda_host::launch->grid)

inline void __syncthreads() { cuda_host::barrier(cuda_host::live_threads()); }
inline int __syncthreads_count(int predicate) {
    cuda_host::launch->votes += predicate != 0;
    __syncthreads();
    return (int)cuda_host::launch->voted;
}
inline int __syncthreads_or(int predicate) { return __syncthreads_count(predicate) != 0; }
inline int __syncthreads_and(int predicate) {
    cuda_host::launch->votes += predicate != 0;
    __syncthreads();
    return cuda_host::launch->voted == cuda_host::launch->participants;
}
inline void __syncwarp(unsigned int = 0xFFFFFFFFu) { cuda_host::warp_barrier(); }
inline void bob_host_counted_barrier(unsigned int count) { cuda_host::barrier(count); }
inline void* bob_host_dynamic_shared() { return cuda_host::launch->dynamic_shared.data(); }
inline unsigned int bob_host_dynamic_shared_bytes() {
    return (unsigned int)(16 * cuda_host::launch->dynamic_shared.size());
}
inline size_t __cvta_generic_to_shared(const void* p) { return (size_t)p; }

[[noreturn]] inline void __trap() {
    std::fprintf(stderr, "cuda_host: __trap() in block %u thread %u\n", blockIdx.x, threadIdx.x);
    std::abort();
}

template <typename T>
inline T __shfl_sync(unsigned int, T value, int lane, int width = 32) {
    (void)width;
    return cuda_host::exchange(value, (unsigned int)lane & 31u, true);
}
template <typename T>
inline T __shfl_down_sync(unsigned int, T value, unsigned int delta, int width = 32) {
    (void)width;
    const unsigned int lane = threadIdx.x % 32 + delta;
    return cuda_host::exchange(value, lane, lane < 32);
}
template <typename T>
inline T __shfl_up_sync(unsigned int, T value, unsigned int delta, int width = 32) {
    (void)width;
    const unsigned int lane = threadIdx.x % 32;
    return cuda_host::exchange(value, lane - delta, lane >= delta);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int, T value, int mask, int width = 32) {
    (void)width;
    return cuda_host::exchange(value, (threadIdx.x % 32) ^ (unsigned int)mask, true);
}

// The warp votes and reductions (redux.sync): every live lane's word, then the same
// answer to each; signed and unsigned overloads, as CUDA's.
template <typename T>
inline T bob_host_reduce(T value, int how) {
    using namespace cuda_host;
    const unsigned int me = launch->current;
    const unsigned int base = me / 32 * 32;
    unsigned long long word = 0;
    std::memcpy(&word, &value, sizeof(T));
    launch->lanes[me] = word;
    warp_barrier();
    bool first = true;
    T result{};
    for (unsigned int i = base; i < base + 32 && i < launch->threads.size(); ++i) {
        if (launch->threads[i].done) continue;
        T lane;
        std::memcpy(&lane, &launch->lanes[i], sizeof(T));
        if (first) result = lane;
        else if (how == 0) result = lane > result ? lane : result;  // max
        else if (how == 1) result = (T)(result + lane);  // add
        else result = lane < result ? lane : result;  // min
        first = false;
    }
    warp_barrier();
    return result;
}
inline int __reduce_max_sync(unsigned int, int value) { return bob_host_reduce(value, 0); }
inline unsigned int __reduce_max_sync(unsigned int, unsigned int value) {
    return bob_host_reduce(value, 0);
}
inline int __reduce_add_sync(unsigned int, int value) { return bob_host_reduce(value, 1); }
inline unsigned int __reduce_add_sync(unsigned int, unsigned int value) {
    return bob_host_reduce(value, 1);
}
inline int __reduce_min_sync(unsigned int, int value) { return bob_host_reduce(value, 2); }
inline unsigned int __reduce_min_sync(unsigned int, unsigned int value) {
    return bob_host_reduce(value, 2);
}
inline int __any_sync(unsigned int, int predicate) {
    return bob_host_reduce(predicate != 0 ? 1u : 0u, 0) != 0;
}
inline int __all_sync(unsigned int, int predicate) {
    return bob_host_reduce(predicate != 0 ? 1u : 0u, 2) != 0;
}

// Atomics: one OS thread runs every CUDA thread, so a plain read-modify-write is atomic.
template <typename T>
inline T atomicAdd(T* address, T value) {
    const T old = *address;
    *address = old + value;
    return old;
}

inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
inline unsigned int __float_as_uint(float f) { unsigned int x; std::memcpy(&x, &f, 4); return x; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline int __float2int_rn(float x) {  // cvt.rni.s32.f32: NaN gives 0, saturating
    if (x != x) return 0;
    if (x >= 2147483648.0f) return 2147483647;
    if (x <= -2147483648.0f) return (-2147483647 - 1);
    return (int)std::nearbyint(x);
}
inline int __clz(unsigned int x) { return x ? __builtin_clz(x) : 32; }
inline int __clzll(unsigned long long x) { return x ? __builtin_clzll(x) : 64; }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// What the source's inline PTX computes.
inline float bob_host_flush(float x) {  // FTZ: a subnormal is a zero of its sign
    return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.0f, x) : x;
}
inline float bob_host_rcp_approx_ftz(float x) { return bob_host_flush(1.0f / bob_host_flush(x)); }
inline float bob_host_rsqrt_approx_ftz(float x) {
    return bob_host_flush(1.0f / std::sqrt(bob_host_flush(x)));
}
inline float bob_host_mul_ftz(float a, float b) {
    return bob_host_flush(bob_host_flush(a) * bob_host_flush(b));
}
