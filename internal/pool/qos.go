package pool

import "github.com/quiverstorage/quiver/internal/qos"

// QoS returns the limiter of the volume: one budget shared by all its disks.
// Data paths wait on it before they take the I/O gate, so throttled requests
// never hold up a snapshot.
func (v *Volume) QoS() *qos.Limiter {
	m := v.manifest()
	return v.pool.limiter(v.name, m.QoS)
}

// limiter returns the volume's limiter, creating it with limits on first use.
func (p *Pool) limiter(volume string, limits *qos.Limits) *qos.Limiter {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.limiters == nil {
		p.limiters = map[string]*qos.Limiter{}
	}
	l, ok := p.limiters[volume]
	if !ok {
		l = qos.New(limitsOf(limits))
		p.limiters[volume] = l
	}
	return l
}

func limitsOf(l *qos.Limits) qos.Limits {
	if l == nil {
		return qos.Limits{}
	}
	return *l
}

func qosOrNil(l qos.Limits) *qos.Limits {
	if l.Unlimited() {
		return nil
	}
	return &l
}
