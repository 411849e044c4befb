#!/usr/bin/env python3
# A stand-in for a real API upstream, for benches/instructions.sh (MOCK_BIN=benches/api_upstream.py):
# the benchbed's chat reply with the two dozen headers OpenAI's API answers with (rate limits,
# tracing, a cookie, CDN headers), where the benchbed's mock sends three. Usage: api_upstream.py PORT
import sys, http.server, socketserver, json
body=json.dumps({"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"mock-gpt","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, how are you today"},"finish_reason":"stop"}],"usage":{"prompt_tokens":40,"completion_tokens":20,"total_tokens":60}}).encode()
extra=[("Date","Fri, 27 Nov 2026 21:00:00 GMT"),("Connection","keep-alive"),("access-control-expose-headers","X-Request-ID"),
("openai-organization","org-abcdefghijklmnop"),("openai-processing-ms","412"),("openai-project","proj_abcdefghijklmnop"),("openai-version","2020-10-01"),
("x-envoy-upstream-service-time","415"),("x-ratelimit-limit-requests","10000"),("x-ratelimit-limit-tokens","30000000"),("x-ratelimit-remaining-requests","9999"),
("x-ratelimit-remaining-tokens","29999980"),("x-ratelimit-reset-requests","6ms"),("x-ratelimit-reset-tokens","0s"),("x-request-id","req_0123456789abcdef0123456789abcdef"),
("strict-transport-security","max-age=31536000; includeSubDomains; preload"),("cf-cache-status","DYNAMIC"),
("set-cookie","__cf_bm=abcdefghijklmnopqrstuvwxyz0123456789; path=/; expires=Fri, 27-Nov-26 21:30:00 GMT; domain=.api.openai.com; HttpOnly; Secure; SameSite=None"),
("X-Content-Type-Options","nosniff"),("Server","cloudflare"),("CF-RAY","8e8e8e8e8e8e8e8e-AMS"),("alt-svc",'h3=":443"; ma=86400')]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version="HTTP/1.1"
    def do_POST(self):
        n=int(self.headers.get('content-length',0)); self.rfile.read(n)
        self.send_response_only(200)
        self.send_header("Content-Type","application/json")
        for k,v in extra: self.send_header(k,v)
        self.send_header("Content-Length",str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self,*a): pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer): daemon_threads=True
S(("127.0.0.1",int(sys.argv[1])),H).serve_forever()
