package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"
	"time"
)

func main() {
	listen := flag.String("listen", "", "host:port to accept on (this machine's loopback)")
	to := flag.String("to", "", "host:port to forward to (the API server in its network namespace)")
	flag.Parse()
	if *listen == "" || *to == "" {
		fmt.Fprintln(os.Stderr, "usage: luaop-forwarder -listen 127.0.0.1:PORT -to ADDR:PORT")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("luaop-forwarder: %v", err)
	}
	log.Printf("luaop-forwarder: %s -> %s", ln.Addr(), *to)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Printf("luaop-forwarder: accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go forward(c.(*net.TCPConn), *to)
	}
}

// forward copies both ways until each side has closed its half.
func forward(in *net.TCPConn, to string) {
	defer func() { _ = in.Close() }()
	c, err := net.DialTimeout("tcp", to, 5*time.Second)
	if err != nil {
		log.Printf("luaop-forwarder: %s: %v", to, err)
		return
	}
	out := c.(*net.TCPConn)
	defer func() { _ = out.Close() }()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src *net.TCPConn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		_ = dst.CloseWrite()
	}
	go pipe(out, in)
	go pipe(in, out)
	wg.Wait()
}
