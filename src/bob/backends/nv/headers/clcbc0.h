/*******************************************************************************
    Copyright (c) 2023, NVIDIA CORPORATION. All rights reserved.

    Permission is hereby granted, free of charge, to any person obtaining a
    copy of this software and associated documentation files (the "Software"),
    to deal in the Software without restriction, including without limitation
    the rights to use, copy, modify, merge, publish, distribute, sublicense,
    and/or sell copies of the Software, and to permit persons to whom the
    Software is furnished to do so, subject to the following conditions:

    The above copyright notice and this permission notice shall be included in
    all copies or substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
    IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
    FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.  IN NO EVENT SHALL
    THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
    LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
    FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
    DEALINGS IN THE SOFTWARE.

*******************************************************************************/

/*
 * Vendored by Bob: an excerpt of
 *   NVIDIA/open-gpu-doc classes/compute/clcbc0.h
 *   at commit 5d957df1787982e35961ab2ee6834670c6684cb9:
 * the lines Bob uses, verbatim and in their original order.
 * NVIDIA's license above covers them.
 */

#define HOPPER_COMPUTE_A    0xCBC0

#define NVCBC0_SET_OBJECT                                                                                  0x0000
#define NVCBC0_SET_OBJECT_CLASS_ID                                                                           15:0
#define NVCBC0_SET_OBJECT_ENGINE_ID                                                                         20:16

#define NVCBC0_WAIT_FOR_IDLE                                                                               0x0110
#define NVCBC0_WAIT_FOR_IDLE_V                                                                               31:0

#define NVCBC0_SET_SHADER_SHARED_MEMORY_WINDOW_A                                                           0x02a0
#define NVCBC0_SET_SHADER_SHARED_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER                                          16:0

#define NVCBC0_SET_SHADER_SHARED_MEMORY_WINDOW_B                                                           0x02a4
#define NVCBC0_SET_SHADER_SHARED_MEMORY_WINDOW_B_BASE_ADDRESS                                                31:0

#define NVCBC0_SEND_PCAS_A                                                                                 0x02b4
#define NVCBC0_SEND_PCAS_A_QMD_ADDRESS_SHIFTED8                                                              31:0

#define NVCBC0_SEND_SIGNALING_PCAS2_B                                                                      0x02c0
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION                                                             3:0
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_NOP                                                  0x00000000
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE                                           0x00000001
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_SCHEDULE                                             0x00000002
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_COPY_SCHEDULE                             0x00000003
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INCREMENT_PUT                                        0x00000006
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_DECREMENT_DEPENDENCE                                 0x00000007
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_PREFETCH                                             0x00000008
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_PREFETCH_SCHEDULE                                    0x00000009
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_PREFETCH_COPY_SCHEDULE                    0x0000000A
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INVALIDATE_PREFETCH_COPY_FORCE_REQUIRE_SCHEDULING             0x0000000B
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INCREMENT_DEPENDENCE                                 0x0000000C
#define NVCBC0_SEND_SIGNALING_PCAS2_B_PCAS_ACTION_INCREMENT_CWD_REF_COUNTER                            0x0000000D
#define NVCBC0_SEND_SIGNALING_PCAS2_B_SELECT                                                                 13:8
#define NVCBC0_SEND_SIGNALING_PCAS2_B_OFFSET_MINUS_ONE                                                      23:14

#define NVCBC0_SET_SHADER_LOCAL_MEMORY_WINDOW_A                                                            0x07b0
#define NVCBC0_SET_SHADER_LOCAL_MEMORY_WINDOW_A_BASE_ADDRESS_UPPER                                           16:0

#define NVCBC0_SET_SHADER_LOCAL_MEMORY_WINDOW_B                                                            0x07b4
#define NVCBC0_SET_SHADER_LOCAL_MEMORY_WINDOW_B_BASE_ADDRESS                                                 31:0
