// Command toolbox is the one program of the test node's toolbox image (package node,
// ToolboxImage), busybox-style: no registry is reachable here, so the commands kubectl's
// streaming verbs run in a container are built from this static program.
//
// As "box serve PORT" (the container's main process) it links /bin/cat, echo, exit, test and
// tar to itself (the pod runs it as root for that), echoes every TCP connection on
// 127.0.0.1:PORT (what port-forward reaches in a host-network pod), prints "tick N" on stdout
// every 200 ms (what attach shows), and exits 0 on SIGTERM. Under another name it is that
// command: cat (stdin to stdout), echo ARGS, exit N, test -d PATH, and the tar that kubectl cp
// runs (test/cluster/kubecp).
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/watchsan/watchsan/test/cluster/kubecp"
)

var links = []string{"cat", "echo", "exit", "test", "tar"}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if name == "box" && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	os.Exit(run(name, args))
}

func fail(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	return code
}

func run(name string, args []string) int {
	switch name {
	case "serve":
		if len(args) != 1 {
			return fail(2, "usage: box serve PORT")
		}
		return serve(args[0])
	case "cat":
		if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
			return fail(1, "cat: %v", err)
		}
		return 0
	case "echo":
		fmt.Println(strings.Join(args, " "))
		return 0
	case "exit":
		if len(args) == 0 {
			return 0
		}
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return fail(2, "exit: %q: numeric argument required", args[0])
		}
		return n
	case "test":
		if len(args) != 2 || args[0] != "-d" {
			return fail(2, "test: only test -d PATH")
		}
		if fi, err := os.Stat(args[1]); err != nil || !fi.IsDir() {
			return 1
		}
		return 0
	case "tar":
		return tarCmd(args)
	}
	return fail(127, "%s: command not found", name)
}

func serve(port string) int {
	self, err := os.Executable()
	if err != nil {
		return fail(1, "box: %v", err)
	}
	for _, l := range links {
		p := filepath.Join(filepath.Dir(self), l)
		_ = os.Remove(p)
		if err := os.Symlink(self, p); err != nil {
			return fail(1, "box: link %s: %v", p, err)
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		return fail(1, "box: %v", err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }() // until the client closes
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-sig:
			return 0
		case <-tick.C:
			fmt.Printf("tick %d\n", n)
		}
	}
}

func tarCmd(args []string) int {
	err := kubecp.Tar("/", args, os.Stdin, os.Stdout)
	if e := (*kubecp.ExitError)(nil); errors.As(err, &e) {
		return fail(e.Code, "%s", e.Msg)
	}
	if err != nil {
		return fail(2, "tar: %v", err)
	}
	return 0
}
