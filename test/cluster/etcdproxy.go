package cluster

import (
	"net"
	"sync"
)

// pauseProxy is a TCP proxy between one apiserver and etcd that can stop forwarding while
// keeping every connection open: the apiserver then sees an etcd that accepts and never
// answers, so its watch cache stops advancing while the apiserver itself keeps serving from
// it (the lagging apiserver of kubernetes#59848).
type pauseProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	paused bool
	resume chan struct{} // closed at Resume; replaced at Pause
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func newPauseProxy(target string) (*pauseProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &pauseProxy{ln: ln, target: target, resume: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.resume)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is what the apiserver is given as --etcd-servers.
func (p *pauseProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *pauseProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// track records a connection pair; false once the proxy is closed (they are closed then).
func (p *pauseProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// untrack closes and forgets a connection pair.
func (p *pauseProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

// pipe copies from src to dst, holding every chunk while paused.
func (p *pauseProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.untrack(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.resume
			p.mu.Unlock()
			<-gate // closed while forwarding; Close closes it too
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: the deferred closes end the other direction
		}
	}
}

// Pause stops forwarding in both directions; connections stay open.
func (p *pauseProxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused && !p.closed {
		p.paused = true
		p.resume = make(chan struct{})
	}
}

// Resume forwards again, held data first.
func (p *pauseProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		close(p.resume)
	}
}

// Close stops the proxy and every connection through it, and waits for its goroutines.
func (p *pauseProxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	if p.paused {
		p.paused = false
		close(p.resume)
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
