// Command swapper is a workspace owner racing Corral: in a loop, it
// exchanges each directory it is given with a link to a host directory
// (renameat2 RENAME_EXCHANGE, so the name is always there, a directory or
// a link) and back. On SIGTERM it puts every directory back that it can
// and prints how many exchanges it made.
//
//	swapper -target DIR [-hold D] [-pause D] PATH...
//
// -hold is how long the link stays in place, -pause how long the directory
// does before the next exchange (both 0 by default: as fast as it can).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	target := flag.String("target", "", "the host directory the links lead to")
	hold := flag.Duration("hold", 0, "how long a link stays in place")
	pause := flag.Duration("pause", 0, "how long a directory stays in place between exchanges")
	flag.Parse()
	paths := flag.Args()
	for _, p := range paths {
		if err := os.Symlink(*target, p+".link"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	exchange := func(p string) bool {
		return unix.Renameat2(unix.AT_FDCWD, p, unix.AT_FDCWD, p+".link", unix.RENAME_EXCHANGE) == nil
	}
	swaps := 0
	out := map[string]bool{} // exchanged, not yet back
	back := func() {
		for p := range out {
			if exchange(p) {
				delete(out, p)
			}
		}
	}
	for {
		select {
		case <-stop:
			back()
			fmt.Printf("swaps %d\n", swaps)
			if len(out) > 0 {
				fmt.Printf("not put back: %v\n", out)
			}
			return
		default:
		}
		back() // what an earlier round could not put back (its parent closed for a while)
		for _, p := range paths {
			if !out[p] && exchange(p) {
				swaps++
				out[p] = true
				time.Sleep(*hold)
				// Back, unless a directory the walk closed keeps it: then
				// a later round tries again.
				back()
			}
		}
		time.Sleep(*pause)
	}
}
