//go:build !amd64 || purego

package crypt

// haveAsm, haveVAES: there is no assembly path on this architecture (or
// with the purego build tag); the cipher uses crypto/aes.
const haveAsm, haveVAES = false, false

func (c *Cipher) cryptAsm([]byte, int, uint64, bool) {
	panic("crypt: no assembly path on this architecture")
}
