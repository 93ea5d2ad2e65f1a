package objstore

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config says how to reach a bucket.
type S3Config struct {
	Endpoint  string // host:port
	Bucket    string
	Prefix    string // keys live under it ("" or ending in "/")
	Region    string
	AccessKey string
	SecretKey string
	// Insecure talks plain HTTP: allowed only to a loopback endpoint.
	Insecure bool
	// CAPEM, when set, holds the only CAs trusted for the endpoint's TLS.
	CAPEM []byte
	// Timeout bounds each request (0: one minute).
	Timeout time.Duration
}

type s3Store struct {
	c       *minio.Client
	cfg     S3Config
	timeout time.Duration
}

// NewS3 returns the store of a bucket; it checks that the bucket exists.
func NewS3(ctx context.Context, cfg S3Config) (Store, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errors.New("object store: an endpoint (host:port) and a bucket are required")
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.Insecure && !loopbackHost(cfg.Endpoint) {
		return nil, fmt.Errorf("object store %s: plain HTTP is allowed only to a loopback address; use TLS", cfg.Endpoint)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if len(cfg.CAPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cfg.CAPEM) {
			return nil, errors.New("object store: the CA file holds no PEM certificate")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:    !cfg.Insecure,
		Region:    cfg.Region,
		Transport: tr,
	})
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", cfg.Endpoint, err)
	}
	s := &s3Store{c: c, cfg: cfg, timeout: cfg.Timeout}
	if s.timeout == 0 {
		s.timeout = time.Minute
	}
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ok, err := c.BucketExists(cctx, cfg.Bucket)
	if err != nil {
		return nil, s.wrap("bucket "+cfg.Bucket, err)
	}
	if !ok {
		return nil, fmt.Errorf("object store %s: bucket %q does not exist: %w", cfg.Endpoint, cfg.Bucket, ErrNotFound)
	}
	return s, nil
}

func loopbackHost(endpoint string) bool {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		host = endpoint
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (s *s3Store) String() string {
	return fmt.Sprintf("s3://%s/%s/%s", s.cfg.Endpoint, s.cfg.Bucket, s.cfg.Prefix)
}

// wrap maps an S3 error once, at this boundary.
func (s *s3Store) wrap(what string, err error) error {
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == "NoSuchKey" || resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s %s: %w", s, what, ErrNotFound)
	case resp.StatusCode == http.StatusForbidden || resp.Code == "AccessDenied" || resp.Code == "InvalidAccessKeyId" ||
		resp.Code == "SignatureDoesNotMatch":
		return fmt.Errorf("%s %s: %w: %s", s, what, ErrDenied, resp.Message)
	case resp.Code == "InvalidRange" || resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%s %s: %w", s, what, ErrShort)
	case errors.Is(err, context.Canceled):
		return err
	}
	return fmt.Errorf("%s %s: %w: %w", s, what, ErrUnreachable, err)
}

func (s *s3Store) Put(ctx context.Context, key string, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.c.PutObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: true})
	if err != nil {
		return s.wrap("put "+key, err)
	}
	return nil
}

func (s *s3Store) Get(ctx context.Context, key string, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	o, err := s.c.GetObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.wrap("get "+key, err)
	}
	defer o.Close()
	data, err := io.ReadAll(io.LimitReader(o, limit+1))
	if err != nil {
		return nil, s.wrap("get "+key, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s get %s: larger than %d bytes", s, key, limit)
	}
	return data, nil
}

func (s *s3Store) GetRange(ctx context.Context, key string, off, length int64) ([]byte, error) {
	if off < 0 || length <= 0 {
		return nil, fmt.Errorf("%s get %s: range [%d, +%d) is empty or negative", s, key, off, length)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+length-1); err != nil {
		return nil, err
	}
	o, err := s.c.GetObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, opts)
	if err != nil {
		return nil, s.wrap("get "+key, err)
	}
	defer o.Close()
	data := make([]byte, length)
	if n, err := io.ReadFull(o, data); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s get %s: %d bytes at %d, want %d: %w", s, key, n, off, length, ErrShort)
		}
		return nil, s.wrap("get "+key, err)
	}
	return data, nil
}

func (s *s3Store) List(ctx context.Context, prefix string, fn func(string, int64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for o := range s.c.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.cfg.Prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return s.wrap("list "+prefix, o.Err)
		}
		if err := fn(strings.TrimPrefix(o.Key, s.cfg.Prefix), o.Size); err != nil {
			return err
		}
	}
	return nil
}

func (s *s3Store) Delete(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.c.RemoveObject(ctx, s.cfg.Bucket, s.cfg.Prefix+key, minio.RemoveObjectOptions{}); err != nil {
		if errors.Is(s.wrap("", err), ErrNotFound) {
			return nil
		}
		return s.wrap("delete "+key, err)
	}
	return nil
}
