//go:build amd64 && !purego

#include "textflag.h"

// XTS-AES-256 over one data unit with AES-NI (AVX encodings, so that memory
// operands need no alignment), eight AES blocks in flight per iteration so
// that the AES unit's pipeline stays full. The tweak T_0 = AES_k2(n) is
// computed here too; each next tweak is the previous one times x in
// GF(2^128) (IEEE 1619, section 5.2), kept in X8.
//
// Registers: AX data key schedule, BX tweak key schedule, SI data, CX
// iterations left, X0-X7 eight blocks, X8 the running tweak, X9 the
// reduction mask, X10 scratch, X11 a round key, X12 round key 0. The eight
// tweaks of an iteration wait in the frame, 0(SP) to 127(SP), for the XOR
// after the rounds.

// The carries of doubling: bit 63 of the low half goes to bit 0 of the high
// half (dword 2 gets 1), bit 127 comes back as x^7 + x^2 + x + 1 (dword 0
// gets 0x87).
DATA xtsMask<>+0(SB)/4, $0x87
DATA xtsMask<>+4(SB)/4, $0
DATA xtsMask<>+8(SB)/4, $1
DATA xtsMask<>+12(SB)/4, $0
GLOBL xtsMask<>(SB), RODATA|NOPTR, $16

// X8 *= x. PSHUFD puts dword 3 (bit 127 on top) in dword 0 and dword 1
// (bit 63 on top) in dword 2; PSRAD spreads each top bit over its dword;
// the mask keeps the carries; PADDQ shifts both halves left.
#define NEXT_TWEAK \
	VPSHUFD $0x13, X8, X10; \
	VPSRAD  $31, X10, X10; \
	VPAND   X9, X10, X10; \
	VPADDQ  X8, X8, X8; \
	VPXOR   X10, X8, X8

// Block off of the data XOR its tweak XOR round key 0 into x; the tweak
// saved in the frame.
#define LOAD(off, x) \
	VMOVDQU X8, off(SP); \
	VPXOR   off(SI), X8, x; \
	VPXOR   X12, x, x; \
	NEXT_TWEAK

#define ROUND(ins, k) \
	VMOVDQU k(AX), X11; \
	ins X11, X0, X0; \
	ins X11, X1, X1; \
	ins X11, X2, X2; \
	ins X11, X3, X3; \
	ins X11, X4, X4; \
	ins X11, X5, X5; \
	ins X11, X6, X6; \
	ins X11, X7, X7

#define STORE(off, x) \
	VPXOR   off(SP), x, x; \
	VMOVDQU x, off(SI)

// T_0 = AES-256_k2(n), n in CX, into X8.
#define FIRST_TWEAK \
	MOVQ        CX, X8; \
	VPXOR       0(BX), X8, X8; \
	VAESENC     16(BX), X8, X8; \
	VAESENC     32(BX), X8, X8; \
	VAESENC     48(BX), X8, X8; \
	VAESENC     64(BX), X8, X8; \
	VAESENC     80(BX), X8, X8; \
	VAESENC     96(BX), X8, X8; \
	VAESENC     112(BX), X8, X8; \
	VAESENC     128(BX), X8, X8; \
	VAESENC     144(BX), X8, X8; \
	VAESENC     160(BX), X8, X8; \
	VAESENC     176(BX), X8, X8; \
	VAESENC     192(BX), X8, X8; \
	VAESENC     208(BX), X8, X8; \
	VAESENCLAST 224(BX), X8, X8

#define BODY(ins, last) \
	MOVQ    k1+0(FP), AX; \
	MOVQ    k2+8(FP), BX; \
	MOVQ    buf+16(FP), SI; \
	MOVQ    n+32(FP), CX; \
	FIRST_TWEAK; \
	VMOVDQU xtsMask<>(SB), X9; \
	VMOVDQU 0(AX), X12; \
	MOVQ    blocks+24(FP), CX; \
	SHRQ    $3, CX; \
	JZ      done; \
loop: \
	LOAD(0, X0); \
	LOAD(16, X1); \
	LOAD(32, X2); \
	LOAD(48, X3); \
	LOAD(64, X4); \
	LOAD(80, X5); \
	LOAD(96, X6); \
	LOAD(112, X7); \
	ROUND(ins, 16); \
	ROUND(ins, 32); \
	ROUND(ins, 48); \
	ROUND(ins, 64); \
	ROUND(ins, 80); \
	ROUND(ins, 96); \
	ROUND(ins, 112); \
	ROUND(ins, 128); \
	ROUND(ins, 144); \
	ROUND(ins, 160); \
	ROUND(ins, 176); \
	ROUND(ins, 192); \
	ROUND(ins, 208); \
	ROUND(last, 224); \
	STORE(0, X0); \
	STORE(16, X1); \
	STORE(32, X2); \
	STORE(48, X3); \
	STORE(64, X4); \
	STORE(80, X5); \
	STORE(96, X6); \
	STORE(112, X7); \
	ADDQ    $128, SI; \
	DECQ    CX; \
	JNZ     loop; \
done: \
	RET

// func xtsEncryptUnit(k1, k2 *roundKeys, buf *byte, blocks int, n uint64)
TEXT ·xtsEncryptUnit(SB), NOSPLIT, $128-40
	BODY(VAESENC, VAESENCLAST)

// func xtsDecryptUnit(k1, k2 *roundKeys, buf *byte, blocks int, n uint64)
// k1 is the decryption schedule, k2 the encryption one (the tweak is
// always encrypted).
TEXT ·xtsDecryptUnit(SB), NOSPLIT, $128-40
	BODY(VAESDEC, VAESDECLAST)

// The same with VAES on YMM registers (AVX2): two AES blocks per register,
// sixteen in flight per iteration, and two tweaks per register, T_j in the
// low lane and T_j+1 in the high one. The sixteen tweaks of an iteration
// wait in the frame, 0(SP) to 255(SP): the first sixteen are made by
// doubling, once; after that each register's pair advances by x^16 as it
// is used, on its own (WNEXT), so that no chain of dependent doublings
// stands before the AES rounds. Y9 holds 0x87 in the low quadword of each
// lane, Y12 round key 0 in both lanes.

#define WDOUBLE \
	VPSHUFD $0x13, Y8, Y10; \
	VPSRAD  $31, Y10, Y10; \
	VPAND   Y9, Y10, Y10; \
	VPADDQ  Y8, Y8, Y8; \
	VPXOR   Y10, Y8, Y8

// The tweak pair at off, from the doubling chain in Y8.
#define WINIT(off) \
	VMOVDQU Y8, off(SP); \
	WDOUBLE; \
	WDOUBLE

// Blocks off of the data XOR their tweaks XOR round key 0 into y.
#define WLOAD(off, y) \
	VMOVDQU off(SP), y; \
	VPXOR   off(SI), y, y; \
	VPXOR   Y12, y, y

#define WROUND(ins, k) \
	VBROADCASTI128 k(AX), Y11; \
	ins Y11, Y0, Y0; \
	ins Y11, Y1, Y1; \
	ins Y11, Y2, Y2; \
	ins Y11, Y3, Y3; \
	ins Y11, Y4, Y4; \
	ins Y11, Y5, Y5; \
	ins Y11, Y6, Y6; \
	ins Y11, Y7, Y7

// y XOR its tweaks stored at off; then the tweak pair at off times x^16 in
// GF(2^128): each lane shifted up two bytes, the sixteen bits shifted out
// (x^128 to x^143) brought back as their carry-less product with
// x^7 + x^2 + x + 1 (degree at most 22: nothing more to reduce).
#define WSTORE(off, y) \
	VMOVDQU    off(SP), Y10; \
	VPXOR      Y10, y, y; \
	VMOVDQU    y, off(SI); \
	VPSRLDQ    $14, Y10, Y11; \
	VPCLMULQDQ $0x00, Y9, Y11, Y11; \
	VPSLLDQ    $2, Y10, Y10; \
	VPXOR      Y11, Y10, Y10; \
	VMOVDQU    Y10, off(SP)

#define WBODY(ins, last) \
	MOVQ    k1+0(FP), AX; \
	MOVQ    k2+8(FP), BX; \
	MOVQ    buf+16(FP), SI; \
	MOVQ    n+32(FP), CX; \
	FIRST_TWEAK; \
	VMOVDQU xtsMask<>(SB), X9; \
	VMOVDQA X8, X13; \
	VPSHUFD $0x13, X13, X10; \
	VPSRAD  $31, X10, X10; \
	VPAND   X9, X10, X10; \
	VPADDQ  X13, X13, X13; \
	VPXOR   X10, X13, X13; \
	VINSERTI128 $1, X13, Y8, Y8; \
	VBROADCASTI128 xtsMask<>(SB), Y9; \
	WINIT(0); \
	WINIT(32); \
	WINIT(64); \
	WINIT(96); \
	WINIT(128); \
	WINIT(160); \
	WINIT(192); \
	WINIT(224); \
	VBROADCASTI128 0(AX), Y12; \
	MOVQ    blocks+24(FP), CX; \
	SHRQ    $4, CX; \
	JZ      done; \
loop: \
	WLOAD(0, Y0); \
	WLOAD(32, Y1); \
	WLOAD(64, Y2); \
	WLOAD(96, Y3); \
	WLOAD(128, Y4); \
	WLOAD(160, Y5); \
	WLOAD(192, Y6); \
	WLOAD(224, Y7); \
	WROUND(ins, 16); \
	WROUND(ins, 32); \
	WROUND(ins, 48); \
	WROUND(ins, 64); \
	WROUND(ins, 80); \
	WROUND(ins, 96); \
	WROUND(ins, 112); \
	WROUND(ins, 128); \
	WROUND(ins, 144); \
	WROUND(ins, 160); \
	WROUND(ins, 176); \
	WROUND(ins, 192); \
	WROUND(ins, 208); \
	WROUND(last, 224); \
	WSTORE(0, Y0); \
	WSTORE(32, Y1); \
	WSTORE(64, Y2); \
	WSTORE(96, Y3); \
	WSTORE(128, Y4); \
	WSTORE(160, Y5); \
	WSTORE(192, Y6); \
	WSTORE(224, Y7); \
	ADDQ    $256, SI; \
	DECQ    CX; \
	JNZ     loop; \
done: \
	VZEROUPPER; \
	RET

// func xtsEncryptUnitVAES(k1, k2 *roundKeys, buf *byte, blocks int, n uint64)
// blocks: a multiple of 16.
TEXT ·xtsEncryptUnitVAES(SB), NOSPLIT, $256-40
	WBODY(VAESENC, VAESENCLAST)

// func xtsDecryptUnitVAES(k1, k2 *roundKeys, buf *byte, blocks int, n uint64)
TEXT ·xtsDecryptUnitVAES(SB), NOSPLIT, $256-40
	WBODY(VAESDEC, VAESDECLAST)

// func cpuid7ecx() uint32: ECX of CPUID leaf 7, subleaf 0 (bit 9: VAES).
TEXT ·cpuid7ecx(SB), NOSPLIT, $0-4
	MOVL $7, AX
	XORL CX, CX
	CPUID
	MOVL CX, ret+0(FP)
	RET
