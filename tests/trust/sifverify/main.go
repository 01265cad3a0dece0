// The reference SIF signature check: sylabs sif v2 pkg/integrity (what apptainer verify uses),
// built offline from Debian's golang-github-sylabs-sif-dev by tests/trust/test_sif_signature_sylabs.py.
// Usage: sifverify IMAGE.sif PUBLIC.asc -> prints OK (exit 0), FAIL: reason (1) or ERROR (2).
package main

import (
	"fmt"
	"os"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/sylabs/sif/v2/pkg/integrity"
	"github.com/sylabs/sif/v2/pkg/sif"
)

func main() {
	kf, err := os.Open(os.Args[2])
	if err != nil {
		fmt.Println("ERROR:", err)
		os.Exit(2)
	}
	kr, err := openpgp.ReadArmoredKeyRing(kf)
	if err != nil {
		fmt.Println("ERROR:", err)
		os.Exit(2)
	}
	f, err := sif.LoadContainerFromPath(os.Args[1], sif.OptLoadWithFlag(os.O_RDONLY))
	if err != nil {
		fmt.Println("ERROR:", err)
		os.Exit(2)
	}
	defer f.UnloadContainer()
	v, err := integrity.NewVerifier(f, integrity.OptVerifyWithKeyRing(kr))
	if err == nil {
		err = v.Verify()
	}
	if err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("OK")
}
