import { defineConfig } from "vite";

// `npm run dev` proxies the API to a berthd on :8080; `npm run build` writes dist/, which
// berthd serves at /.
export default defineConfig({
  server: { proxy: { "/api": "http://127.0.0.1:8080" } },
  build: { outDir: "dist", emptyOutDir: true, chunkSizeWarningLimit: 200 },
});
