/*
 * SPDX-FileCopyrightText: Copyright (c) 2020-2022 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
 * SPDX-License-Identifier: MIT
 *
 * Permission is hereby granted, free of charge, to any person obtaining a
 * copy of this software and associated documentation files (the "Software"),
 * to deal in the Software without restriction, including without limitation
 * the rights to use, copy, modify, merge, publish, distribute, sublicense,
 * and/or sell copies of the Software, and to permit persons to whom the
 * Software is furnished to do so, subject to the following conditions:
 *
 * The above copyright notice and this permission notice shall be included in
 * all copies or substantial portions of the Software.
 *
 * THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 * IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 * FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL
 * THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 * LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
 * FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
 * DEALINGS IN THE SOFTWARE.
 */

/*
 * Vendored by Bob: an excerpt of
 *   NVIDIA/open-gpu-kernel-modules src/common/sdk/nvidia/inc/class/clc56f.h
 *   at commit 1739a20efc4acb55fd1dc53dcc66057b70c2613c:
 * the lines Bob uses, verbatim and in their original order.
 * NVIDIA's license above covers them.
 */

/* class AMPERE_CHANNEL_GPFIFO  */
#define  AMPERE_CHANNEL_GPFIFO_A                           (0x0000C56F)

/* fields and values */
#define NVC56F_NUMBER_OF_SUBCHANNELS                               (8)
#define NVC56F_SET_OBJECT                                          (0x00000000)
#define NVC56F_SET_OBJECT_NVCLASS                                         15:0
#define NVC56F_SET_OBJECT_ENGINE                                         20:16
#define NVC56F_SET_OBJECT_ENGINE_SW                                 0x0000001f
#define NVC56F_SEM_ADDR_LO                                         (0x0000005c)
#define NVC56F_SEM_ADDR_LO_OFFSET                                         31:2
#define NVC56F_SEM_ADDR_HI                                         (0x00000060)
#define NVC56F_SEM_ADDR_HI_OFFSET                                          7:0
#define NVC56F_SEM_PAYLOAD_LO                                      (0x00000064)
#define NVC56F_SEM_PAYLOAD_LO_PAYLOAD                                     31:0
#define NVC56F_SEM_PAYLOAD_HI                                      (0x00000068)
#define NVC56F_SEM_PAYLOAD_HI_PAYLOAD                                     31:0
#define NVC56F_SEM_EXECUTE                                         (0x0000006c)
#define NVC56F_SEM_EXECUTE_OPERATION                                       2:0
#define NVC56F_SEM_EXECUTE_OPERATION_ACQUIRE                        0x00000000
#define NVC56F_SEM_EXECUTE_OPERATION_RELEASE                        0x00000001
#define NVC56F_SEM_EXECUTE_OPERATION_ACQ_STRICT_GEQ                 0x00000002
#define NVC56F_SEM_EXECUTE_OPERATION_ACQ_CIRC_GEQ                   0x00000003
#define NVC56F_SEM_EXECUTE_OPERATION_ACQ_AND                        0x00000004
#define NVC56F_SEM_EXECUTE_OPERATION_ACQ_NOR                        0x00000005
#define NVC56F_SEM_EXECUTE_OPERATION_REDUCTION                      0x00000006
#define NVC56F_SEM_EXECUTE_ACQUIRE_SWITCH_TSG                            12:12
#define NVC56F_SEM_EXECUTE_ACQUIRE_SWITCH_TSG_DIS                   0x00000000
#define NVC56F_SEM_EXECUTE_ACQUIRE_SWITCH_TSG_EN                    0x00000001
#define NVC56F_SEM_EXECUTE_RELEASE_WFI                                   20:20
#define NVC56F_SEM_EXECUTE_RELEASE_WFI_DIS                          0x00000000
#define NVC56F_SEM_EXECUTE_RELEASE_WFI_EN                           0x00000001
#define NVC56F_SEM_EXECUTE_PAYLOAD_SIZE                                  24:24
#define NVC56F_SEM_EXECUTE_PAYLOAD_SIZE_32BIT                       0x00000000
#define NVC56F_SEM_EXECUTE_PAYLOAD_SIZE_64BIT                       0x00000001
#define NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP                             25:25
#define NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP_DIS                    0x00000000
#define NVC56F_SEM_EXECUTE_RELEASE_TIMESTAMP_EN                     0x00000001
#define NVC56F_SEM_EXECUTE_REDUCTION                                     30:27
#define NVC56F_SEM_EXECUTE_REDUCTION_IMIN                           0x00000000
#define NVC56F_SEM_EXECUTE_REDUCTION_IMAX                           0x00000001
#define NVC56F_SEM_EXECUTE_REDUCTION_IXOR                           0x00000002
#define NVC56F_SEM_EXECUTE_REDUCTION_IAND                           0x00000003
#define NVC56F_SEM_EXECUTE_REDUCTION_IOR                            0x00000004
#define NVC56F_SEM_EXECUTE_REDUCTION_IADD                           0x00000005
#define NVC56F_SEM_EXECUTE_REDUCTION_INC                            0x00000006
#define NVC56F_SEM_EXECUTE_REDUCTION_DEC                            0x00000007
#define NVC56F_SEM_EXECUTE_REDUCTION_FORMAT                              31:31
#define NVC56F_SEM_EXECUTE_REDUCTION_FORMAT_SIGNED                  0x00000000
#define NVC56F_SEM_EXECUTE_REDUCTION_FORMAT_UNSIGNED                0x00000001


/* GPFIFO entry format */
#define NVC56F_GP_ENTRY__SIZE                                   8
#define NVC56F_GP_ENTRY0_FETCH                                0:0
#define NVC56F_GP_ENTRY0_FETCH_UNCONDITIONAL           0x00000000
#define NVC56F_GP_ENTRY0_FETCH_CONDITIONAL             0x00000001
#define NVC56F_GP_ENTRY0_GET                                 31:2
#define NVC56F_GP_ENTRY0_OPERAND                             31:0
#define NVC56F_GP_ENTRY1_GET_HI                               7:0
#define NVC56F_GP_ENTRY1_LEVEL                                9:9
#define NVC56F_GP_ENTRY1_LEVEL_MAIN                    0x00000000
#define NVC56F_GP_ENTRY1_LEVEL_SUBROUTINE              0x00000001
#define NVC56F_GP_ENTRY1_LENGTH                             30:10
#define NVC56F_GP_ENTRY1_SYNC                               31:31
#define NVC56F_GP_ENTRY1_SYNC_PROCEED                  0x00000000
#define NVC56F_GP_ENTRY1_SYNC_WAIT                     0x00000001
#define NVC56F_GP_ENTRY1_OPCODE                               7:0
#define NVC56F_GP_ENTRY1_OPCODE_NOP                    0x00000000
#define NVC56F_GP_ENTRY1_OPCODE_ILLEGAL                0x00000001
#define NVC56F_GP_ENTRY1_OPCODE_GP_CRC                 0x00000002
#define NVC56F_GP_ENTRY1_OPCODE_PB_CRC                 0x00000003

/* dma method formats */
#define NVC56F_DMA_METHOD_ADDRESS_OLD                              12:2
#define NVC56F_DMA_METHOD_ADDRESS                                  11:0
#define NVC56F_DMA_SUBDEVICE_MASK                                  15:4
#define NVC56F_DMA_METHOD_SUBCHANNEL                               15:13
#define NVC56F_DMA_TERT_OP                                         17:16
#define NVC56F_DMA_TERT_OP_GRP0_INC_METHOD                         (0x00000000)
#define NVC56F_DMA_TERT_OP_GRP0_SET_SUB_DEV_MASK                   (0x00000001)
#define NVC56F_DMA_TERT_OP_GRP0_STORE_SUB_DEV_MASK                 (0x00000002)
#define NVC56F_DMA_TERT_OP_GRP0_USE_SUB_DEV_MASK                   (0x00000003)
#define NVC56F_DMA_TERT_OP_GRP2_NON_INC_METHOD                     (0x00000000)
#define NVC56F_DMA_METHOD_COUNT_OLD                                28:18
#define NVC56F_DMA_METHOD_COUNT                                    28:16
#define NVC56F_DMA_IMMD_DATA                                       28:16
#define NVC56F_DMA_SEC_OP                                          31:29
#define NVC56F_DMA_SEC_OP_GRP0_USE_TERT                            (0x00000000)
#define NVC56F_DMA_SEC_OP_INC_METHOD                               (0x00000001)
#define NVC56F_DMA_SEC_OP_GRP2_USE_TERT                            (0x00000002)
#define NVC56F_DMA_SEC_OP_NON_INC_METHOD                           (0x00000003)
#define NVC56F_DMA_SEC_OP_IMMD_DATA_METHOD                         (0x00000004)
#define NVC56F_DMA_SEC_OP_ONE_INC                                  (0x00000005)
#define NVC56F_DMA_SEC_OP_RESERVED6                                (0x00000006)
#define NVC56F_DMA_SEC_OP_END_PB_SEGMENT                           (0x00000007)
/* dma incrementing method format */
#define NVC56F_DMA_INCR_ADDRESS                                    11:0
#define NVC56F_DMA_INCR_SUBCHANNEL                                 15:13
#define NVC56F_DMA_INCR_COUNT                                      28:16
#define NVC56F_DMA_INCR_OPCODE                                     31:29
#define NVC56F_DMA_INCR_OPCODE_VALUE                               (0x00000001)
#define NVC56F_DMA_INCR_DATA                                       31:0
/* dma non-incrementing method format */
#define NVC56F_DMA_NONINCR_ADDRESS                                 11:0
#define NVC56F_DMA_NONINCR_SUBCHANNEL                              15:13
#define NVC56F_DMA_NONINCR_COUNT                                   28:16
#define NVC56F_DMA_NONINCR_OPCODE                                  31:29
#define NVC56F_DMA_NONINCR_OPCODE_VALUE                            (0x00000003)
#define NVC56F_DMA_NONINCR_DATA                                    31:0
/* dma increment-once method format */
#define NVC56F_DMA_ONEINCR_ADDRESS                                 11:0
#define NVC56F_DMA_ONEINCR_SUBCHANNEL                              15:13
#define NVC56F_DMA_ONEINCR_COUNT                                   28:16
#define NVC56F_DMA_ONEINCR_OPCODE                                  31:29
#define NVC56F_DMA_ONEINCR_OPCODE_VALUE                            (0x00000005)
#define NVC56F_DMA_ONEINCR_DATA                                    31:0
/* dma no-operation format */
#define NVC56F_DMA_NOP                                             (0x00000000)
/* dma immediate-data format */
#define NVC56F_DMA_IMMD_ADDRESS                                    11:0
#define NVC56F_DMA_IMMD_SUBCHANNEL                                 15:13
#define NVC56F_DMA_IMMD_DATA                                       28:16
#define NVC56F_DMA_IMMD_OPCODE                                     31:29
#define NVC56F_DMA_IMMD_OPCODE_VALUE                               (0x00000004)
/* dma end-segment format */
#define NVC56F_DMA_ENDSEG_OPCODE                                   31:29
#define NVC56F_DMA_ENDSEG_OPCODE_VALUE                             (0x00000007)
