// Command fifoswap is a hostile worker's helper for the tests: in
// /task/output it makes files a.py and a.bin and FIFOs b.py and b.bin,
// then exchanges each file's name with its FIFO's (renameat2
// RENAME_EXCHANGE) as fast as it can for the given duration, so whatever
// the server opens by any of those names may be a FIFO by the time it
// opens it (a script is saved to shared/scripts too; an unknown extension
// makes the server sniff the content).
//
//	fifoswap 5s
package main

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	d, err := time.ParseDuration(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fifoswap DURATION:", err)
		os.Exit(2)
	}
	exts := []string{".py", ".bin"}
	for _, ext := range exts {
		if err := os.WriteFile("/task/output/a"+ext, []byte("print('hello')\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := unix.Mkfifo("/task/output/b"+ext, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	for end := time.Now().Add(d); time.Now().Before(end); {
		for _, ext := range exts {
			unix.Renameat2(unix.AT_FDCWD, "/task/output/a"+ext, unix.AT_FDCWD, "/task/output/b"+ext, unix.RENAME_EXCHANGE)
		}
	}
}
