var e,t,n,r,i,a,o,s,c,l,u=Symbol.for(`pv`),d={},f=[],p=/^m(i|n|o|s|text|space)$/,m=Array.isArray,h=f.slice,g=Object.assign;function _(e){e&&e.parentNode&&e.remove()}function v(e,t,n){var r,i,a,o={},s=arguments.length;for(a in t)a==`key`?r=t[a]:a==`ref`&&typeof e!=`function`?i=t[a]:o[a]=t[a];return s>2&&(o.children=s>3?h.call(arguments,2):n),y(e,o,r,i,null)}function y(n,r,i,a,o){var s={type:n,props:r,key:i,ref:a,__k:null,__:null,__b:0,__e:null,__c:null,constructor:u,__v:o||++t,__i:-1,__u:0};return!o&&e.vnode&&e.vnode(s),s}function b(e){return e.children}function x(e,t){this.props=e,this.context=t,this.__g=0}function S(e,t){if(t==null)return e.__&&S(e.__,e.__i+1);for(var n;t<e.__k.length;t++)if((n=e.__k[t])&&n.__e)return n.__e;return typeof e.type!=`function`||e.props.__P?null:S(e)}function C(t){var n,r=t.__v,i=r.__e,a=[],o=[],s=t.__P;s&&((n=g({constructor:u},r)).__v=r.__v+1,e.vnode&&e.vnode(n),N(s,n,r,t.__n,s.namespaceURI,32&r.__u?[i]:null,a,i||S(r),32&r.__u,o),n.__v=r.__v,n.__.__k[n.__i]=n,ne(a,n,o),r.__=r.__e=null,n.__e!=i&&w(n))}function w(e){if((e=e.__)&&e.__c&&!e.props.__P)return e.__e=null,e.__k.some(function(t){return t&&(e.__e=t.__e)}),w(e)}function T(t){(8&t.__g||(t.__g|=8,n.push(t),i++))&&r==e.debounceRendering||((r=e.debounceRendering)||queueMicrotask)(E)}function E(){try{for(var e,t=1;n.length;)n.length>t&&n.sort(a),e=n.shift(),t=n.length,8&e.__g&&C(e)}finally{(i=n.length)&&(r||queueMicrotask)(E)}}function ee(e,t,n,r,i,a,o,s,c,l,u){var p,m,h,g,_,v,y=r.__k||f,b=t.length;for(c=D(n,t,y,c,b),p=0;p<b;p++)(h=n.__k[p])!=null&&(m=~h.__i&&y[h.__i]||d,h.__i=p,v=N(e,h,m,i,a,o,s,c,l,u),g=h.__e,(m.ref!=h.ref||8&m.__u)&&(m.ref&&F(m.ref,null,h,m),h.ref&&u.push(h.ref,h.__c||g,h)),_||=g,4&h.__u?(c=O(h,c,e,!m.__v),m.__e&&(m.__e=null)):typeof h.type==`function`&&v!==void 0?c=v:g&&(c=g.nextSibling),h.__u&=-21);return n.__e=_,c}function D(e,t,n,r,i){var a,o,s,c,l,d,f,p,h,g=n.length,_=g,v=0,x=0,C=e.__k=Array(i);for(a=0;a<i;a++)(o=t[a])!=null&&typeof o!=`boolean`&&typeof o!=`function`?(typeof o!=`object`||o.constructor===String?o=C[a]=y(null,o):m(o)?o=C[a]=y(b,{children:o}):o.constructor===u&&o.__b?o=C[a]=y(o.type,o.props,o.key,o.ref,o.__v):C[a]=o,c=a+v,o.__=e,o.__b=e.__b+1,s=null,~(l=o.__i=k(o,n,c,_))&&(_--,(s=n[l])&&(s.__u|=2)),s&&s.__v?(o.__u|=16,l==c-1?v--:l==c+1?v++:l!=c&&(l>c?v--:v++,x=1)):(~l||(i>g?v--:i<g&&v++),typeof o.type!=`function`&&(o.__u|=4))):C[a]=null;if(x){for(d=[],f=[],a=0;a<i;a++)if((o=C[a])&&16&o.__u){for(v=0,p=d.length;v<p;)d[h=v+p>>1]<o.__i?v=h+1:p=h;d[v]=o.__i,f[a]=v+1}for(v=d.length;a--;)f[a]&&(f[a]==v?v--:C[a].__u|=4)}if(_)for(a=0;a<g;a++)!(s=n[a])||2&s.__u||(s.__e==r&&(r=S(s)),ie(s,s));return r}function O(e,t,n,r){var i,a,o,s;if(typeof e.type==`function`){if(e.props.__P)return t;if(i=e.__k)for(a=0;a<i.length;a++)i[a]&&(i[a].__=e,t=O(i[a],t,n,!1));return t}for(t&&!t.parentNode&&(t=S(e))&&!t.parentNode&&(t=null),o=e.__e,s=t;s&&s.nodeType==8;)s=s.nextSibling;for(o!=s&&(!r&&n.moveBefore&&o.parentNode?n.moveBefore(o,t):n.insertBefore(o,t||null)),t=o;(t&&=t.nextSibling)&&t.nodeType==8&&!t.data.startsWith(`$s`););return t}function k(e,t,n,r){var i,a=e.key,o=e.type,s=t[n],c=s&&!(2&s.__u);if(s===null&&a==null||c&&a==s.key&&o==s.type)return n;if(r>+!!c){for(i=n-1;i>=0;i--)if((s=t[i])&&!(2&s.__u)&&a==s.key&&o==s.type)return i;for(i=n+1;i<t.length;i++)if((s=t[i])&&!(2&s.__u)&&a==s.key&&o==s.type)return i}return-1}function A(e,t,n){n??=``,t[0]==`-`?e.setProperty(t,n):e[t]=n}function j(e,t,n,r,i){var a,o;if(t==`style`){if(typeof n==`string`)e.style.cssText=n;else{if(typeof r==`string`&&(e.style.cssText=r=``),r)for(t in r)n&&t in n||A(e.style,t);if(n)for(t in n)r&&n[t]==r[t]||A(e.style,t,n[t])}}else if(t[0]==`o`&&t[1]==`n`)typeof n!=`function`&&(n=null),typeof r!=`function`&&(r=null),(e.__e||={})[t]=n,n&&r||(o=l[t]||(l[t]=M(t)),(e.__a||={})[t]=c,a=t!=(t=t.replace(s,`$1`)),(t=t.slice(2))[0]<`a`&&(t=t.toLowerCase()),n?e.addEventListener(t,o,a):e.removeEventListener(t,o,a));else{if(i==`http://www.w3.org/2000/svg`)t=t.replace(/xlink(H|:h)/,`h`).replace(/sName$/,`s`);else if(t!=`width`&&t!=`height`&&t!=`href`&&t!=`list`&&t!=`form`&&t!=`tabIndex`&&t!=`download`&&t!=`rowSpan`&&t!=`colSpan`&&t!=`role`&&t!=`popover`&&t in e)try{e[t]=n??``;return}catch{}if(typeof n==`function`)return;n==null||!1===n&&t[4]!=`-`?e.removeAttribute(t):e.setAttribute(t,t==`popover`&&n==1?``:n)}}function M(t){return function(n){var r=this.__e;if(r){if(r=r[t],n[o]==null)n[o]=c++;else if(n[o]<this.__a[t])return;return r(e.event?e.event(n):n)}}}function N(t,n,r,i,a,o,s,c,l,d){var p,h,v,y,C,w,T,E,D,O,k,A,j,M,N,ne,F,I,L=n.type;if(n.constructor!==u)return null;128&r.__u&&(l=32&r.__u,p=r.__c.__z)&&(n.__u|=l,h=o=[],p.nodeType==8?c=P(p,o):o.push(p),c=o[0]||c),(p=e.__b)&&p(n);e:if(typeof L==`function`){v=s.length;try{if(E=n.props,D=(p=L.prototype)&&p.render,O=(p=L.contextType)&&i[p.__c],k=p?O?O.props.value:p.__:i,(y=r.__c)?(n.__c=y,2&y.__g&&(y.__g|=1)):(D?n.__c=y=new L(E,k):(n.__c=y=new x(E,k),y.constructor=L,y.render=ae),O&&O.sub(y),y.state||(y.state={}),y.__n=i,y.__g|=8,y.__h=[],y.__k=[]),D&&(y.__s||(y.__s=y.state),L.getDerivedStateFromProps&&(y.__s==y.state&&(y.__s=g({},y.__s)),g(y.__s,L.getDerivedStateFromProps(E,y.__s)))),C=y.props,w=y.state,y.__v=n,r.__c){if(E!==C&&D&&!L.getDerivedStateFromProps&&y.componentWillReceiveProps&&y.componentWillReceiveProps(E,k),n.__v==r.__v&&!(8&y.__g)||!(4&y.__g)&&y.shouldComponentUpdate&&!1===y.shouldComponentUpdate(E,y.__s,k)){n.__v!=r.__v&&(y.props=E,y.state=y.__s,y.__g&=-9),n.__e=r.__e,n.__k=r.__k,n.__k.some(function(e){e&&(e.__=n)}),f.push.apply(y.__h,y.__k),y.__k=[],y.__h.length&&s.push(y),c=S(r);break e}y.componentWillUpdate&&y.componentWillUpdate(E,y.__s,k),D&&y.componentDidUpdate&&y.__h.push(function(){y.componentDidUpdate(C,w,T)})}else D&&!L.getDerivedStateFromProps&&y.componentWillMount&&y.componentWillMount(),D&&y.componentDidMount&&y.__h.push(y.componentDidMount);y.context=k,y.props=E,y.__P=t,y.__g&=-5,A=e.__r,j=D?25:0;do y.__g&=-9,A&&A(n),p=y.render(y.props,y.state=y.__s,y.context);while(8&y.__g&&++j<25);D&&(f.push.apply(y.__h,y.__k),y.__k=[]),y.state=y.__s,y.getChildContext&&(i=g({},i,y.getChildContext())),D&&r.__c&&y.getSnapshotBeforeUpdate&&(T=y.getSnapshotBeforeUpdate(C,w)),M=p&&p.type===b&&p.key==null?p.props.children:p,E.__P&&(p=c,a=(t=E.__P).namespaceURI,l=o=null,r.props&&r.props.__P!=t&&(r.__k.some(function(e){e&&ie(e,e)}),r.__k=null),c=r.__k?S(r,0):null),c=ee(t,m(M)?M:[M],n,r,i,a,o,s,c,l,d),E.__P&&(n.__e=null,c=p),n.__u&=-161,h&&h.some(_),y.__h.length&&s.push(y),1&y.__g&&(y.__g&=-4)}catch(t){if(s.length=v,n.__v=null,l||o){if(t&&t.then){if(n.__u|=128|l,o){for(~(F=o.indexOf(c||void 0))||(F=o.length);(I=o[F-1])&&I.nodeType==8;)F--;for(;F<o.length;F++)if(I=o[F]){if(o[F]=null,N){if(I==ne)break}else{if(I.nodeType!=8)break;I.data.startsWith(`$s`)&&(ne=P(N=I))}}}if(!N){for(;c&&c.nodeType==8&&c.nextSibling;)c=c.nextSibling;N=c}(p=P(N=n.__c.__z||(n.__c.__z=N)))?(n.__e=N,c=p):n.__e=c,c&&=c.nextSibling}else o&&o.some(_)}else n.__e=r.__e;n.__k||=r.__k||[],t&&t.then||te(n),e.__e(t,n,r)}}else c=n.__e=re(r.__e,n,r,i,a,o,s,l,d,t);return(p=e.diffed)&&p(n),c}function P(e,t){if(e&&e.nodeType==8&&e.data.startsWith(`$s`))for(var n=1;e=e.nextSibling;){if(e.nodeType==8){if(e.data.startsWith(`$s`))n++;else if(e.data.startsWith(`/$s`)&&!--n)return e}t&&t.push(e)}}function te(e){e&&(e.__c&&(e.__c.__g|=4),e.__k&&e.__k.some(te))}function ne(t,n,r){for(var i=0;i<r.length;)F(r[i++],r[i++],r[i++]);e.__c&&e.__c(n,t),t.some(function(n){try{t=n.__h,n.__h=[],t.some(function(e){e.call(n)})}catch(t){e.__e(t,n.__v)}})}function re(t,n,r,i,a,o,s,c,l,u){var f,g,v,y,b,x,C,w,T=r.props||d,E=n.props,D=n.type;if(D==`svg`?a=`http://www.w3.org/2000/svg`:D==`math`?a=`http://www.w3.org/1998/Math/MathML`:a||=`http://www.w3.org/1999/xhtml`,o){for(f=0;f<o.length;f++)if((b=o[f])&&(D?b.localName==D:b.nodeType==3)){t=b,o[f]=null;break}}if(!t){if(w=u.ownerDocument||document,!D)return w.createTextNode(E);t=w.createElementNS(a,D,E.is?E:u),c&&=(e.__m&&e.__m(n,o),!1),o=null}if(D){if(u=D==`template`&&t.content||t,o=D==`textarea`&&E.defaultValue!=null?null:o&&h.call(u.childNodes),!c&&o)for(T={},f=0;f<t.attributes.length;f++)T[(b=t.attributes[f]).name]=b.value;for(f in T)b=T[f],f==`dangerouslySetInnerHTML`?v=b:f==`children`||f in E||f==`value`&&`defaultValue`in E||f==`checked`&&`defaultChecked`in E||j(t,f,null,b,a);for(f in E)b=E[f],f==`children`?y=b:f==`dangerouslySetInnerHTML`?g=b:f==`value`?x=b:f==`checked`?C=b:c&&typeof b!=`function`||T[f]===b||j(t,f,b,T[f],a);g?(c||v&&(g.__html==v.__html||g.__html==t.innerHTML)||(t.innerHTML=g.__html),n.__k=[]):(v&&(t.textContent=``),(D==`foreignObject`||a==`http://www.w3.org/1998/Math/MathML`&&p.test(D))&&(a=`http://www.w3.org/1999/xhtml`),ee(u,m(y)?y:[y],n,r,i,a,o,s,o?o[0]:r.__k&&S(r,0),c,l),o&&o.some(_)),c&&D!=`textarea`||(f=`value`,D==`progress`&&x==null?t.removeAttribute(f):x==null||x===t[f]&&(D!=`progress`||x)||j(t,f,x,T[f],a),f=`checked`,C!=null&&C!=t[f]&&j(t,f,C,T[f],a))}else T===E||c&&t.data==E||(t.data=E);return t}function F(t,n,r,i){try{typeof t==`function`?n?n.__x=t(n)||1:(i&&=i.__c||i.__e)&&(n=i.__x)&&(i.__x=null,typeof n==`function`?n():t(null)):t.current=n}catch(t){e.__e(t,r)}}function ie(t,n,r){var i,a,o,s;if(e.unmount&&e.unmount(t),!(i=t.ref)||i.current&&i.current!=t.__e||F(i,null,n,t),i=t.__c){if(i.componentWillUnmount)try{i.componentWillUnmount()}catch(t){e.__e(t,n)}i.__P=i.__n=null}if(i=t.__k)for(s=0;s<i.length;s++)i[s]&&ie(i[s],n,typeof t.type!=`function`||r&&!t.props.__P);!r&&(i=t.__c)&&(i=i.__z)&&(a=P(i,o=[]))&&(i==t.__e&&o.some(_),_(a),_(i)),r||_(t.__e),t.__e=t.__c=t.__=null}function ae(e,t,n){return this.constructor(e,n)}function I(t,n){var r,i,a,o;e.__&&e.__(t,n),n.nodeType==9&&(n=n.documentElement),i=(r=t&&32&t.__u)?null:n.__k,n.__k=y(b,{children:[t]}),a=[],o=[],N(n,n.__k,i||d,d,n.namespaceURI,i?null:n.firstChild?h.call(n.childNodes):null,a,i?i.__e:n.firstChild,r,o),ne(a,n.__k,o),n.__k.props.children=null}e={__e:function(e,t,n,r){for(var a,o,s;t=t.__;)if((a=t.__c)&&!(1&a.__g)){a.__g|=4;try{if((s=(o=a.constructor)&&o.getDerivedStateFromError)&&a.setState(o.getDerivedStateFromError(e)),a.componentDidCatch&&(a.componentDidCatch(e,r||{}),s=1),s&&8&a.__g)return void(a.__g|=2)}catch(t){e=t}}throw i=0,e}},t=0,x.prototype.setState=function(e,t){var n=this.__s;n&&n!=this.state||(n=this.__s=g({},this.state)),typeof e==`function`&&(e=e(g({},n),this.props)),e&&(g(n,e),this.__v&&(t&&this.__k.push(t),T(this)))},x.prototype.forceUpdate=function(e){this.__v&&(this.__g|=4,e&&this.__h.push(e),T(this))},x.prototype.render=b,n=[],i=0,a=function(e,t){return e.__v.__b-t.__v.__b},o=Symbol(),s=/(PointerCapture)$|Capture$/i,c=0,l={};var L,R,oe,se,ce=Object.is,le=0,ue=[],de=[],z=e,fe=z.__b,pe=z.__r,me=z.diffed,he=z.__c,ge=z.unmount,_e=z.__;function ve(e,t){z.__h&&z.__h(R,e,le||t),le=0;var n=R.__H||(R.__H={__:[],__h:[]});return e>=n.__.length&&n.__.push({}),n.__[e]}function B(e){return le=1,ye(Oe,e)}function ye(e,t,n){var r=ve(L++,2);if(r.t=e,!r.__c&&(r.__=[n?n(t):Oe(void 0,t),function(e){var t=(r.__N||r.__)[0],n=r.t(t,e);ce(t,n)||(r.__N=[n,r.__[1]],r.__c.setState({}))}],r.__c=R,!R.__f)){R.__f=!0;var i=R.shouldComponentUpdate;R.shouldComponentUpdate=function(e,t,n){var r=this.__H;if(!r)return!0;var a=!1,o=this.props!=e;if(r.__.some(function(e){e.__N&&(a=!0,ce(e.__[0],e.__N[0])||(o=!0))}),i){var s=i.call(this,e,t,n);return a?s||o:s}return!a||o}}return r.__}function V(e,t){var n=ve(L++,3);!z.__s&&De(n.__H,t)&&(n.__P=!0,n.__=e,n.u=t,R.__H.__h.push(n))}function be(e){return le=5,xe(function(){return{current:e}},[])}function xe(e,t){var n=ve(L++,7);return De(n.__H,t)&&(n.__=e(),n.__H=t),n.__}function Se(){var e;do{for(;e=de.shift();)try{H(e)}catch(t){z.__e(t,{__:(e=e.__P)&&e.__v})}for(;e=ue.shift();){var t=e.__H;if(e.__P&&t)try{t.__h.some(H),t.__h.some(Ee),t.__h=[]}catch(n){t.__h=[],z.__e(n,e.__v)}}}while(de.length)}z.__b=function(e){R=null,fe&&fe(e)},z.__=function(e,t){e&&t.__k&&t.__k.__m&&(e.__m=t.__k.__m),_e&&_e(e,t)},z.__r=function(e){pe&&pe(e),L=0;var t=(R=e.__c).__H;t&&(oe==R?R.__h=[]:(t.__h.some(H),t.__h.some(Ee),L=0),t.__h=[],t.__.some(function(e){e.__N&&(e.__=e.__N),e.u=e.__N=void 0})),oe=R},z.diffed=function(e){me&&me(e);var t=e.__c;t&&t.__H&&(t.__H.__h.length&&Te(ue.push(t)),t.__H.__.some(function(e){e.u&&(e.__H=e.u)})),oe=R=null},z.__c=function(e,t){t.some(function(e){try{e.__h.some(H),e.__h=e.__h.filter(function(e){return!e.__||Ee(e)})}catch(t){e.__h=[function(){throw t}]}}),he&&he(e,t)},z.unmount=function(e){ge&&ge(e);var t,n,r=e.__c;r&&r.__H&&(r.__H.__.some(function(r){try{if(r.__P&&r.__c){if(n===void 0){for(n=e.__;n&&(!n.__c||!n.__c.__P);)n=n.__;n&&=n.__c}r.__P=n,Te(de.push(r))}else H(r)}catch(e){t=e}}),r.__H=void 0,t&&z.__e(t,r.__v))};var Ce=typeof requestAnimationFrame==`function`;function we(e){var t,n=function(){clearTimeout(r),Ce&&cancelAnimationFrame(t),setTimeout(e)},r=setTimeout(n,35);Ce&&(t=requestAnimationFrame(n))}function Te(e){e!=1&&se==z.requestAnimationFrame||((se=z.requestAnimationFrame)||we)(Se)}function H(e){var t=R,n=e.__c;typeof n==`function`&&(e.__c=void 0,n()),R=t}function Ee(e){var t=R;e.__c=e.__(),R=t}function De(e,t){return!e||e.length!=t.length||t.some(function(t,n){return!ce(t,e[n])})}function Oe(e,t){return typeof t==`function`?t(e):t}var ke=`quiver.token`;function Ae(){return sessionStorage.getItem(ke)}function je(e){e===null?sessionStorage.removeItem(ke):sessionStorage.setItem(ke,e)}var U=class extends Error{constructor(e,t,n,r){super(n),this.status=e,this.code=t,this.field=r}};async function W(e,t,n,r=Ae()){let i={};r&&(i.Authorization=`Bearer `+r),n!==void 0&&(i[`Content-Type`]=`application/json`);let a;try{a=await fetch(t,{method:e,headers:i,body:n===void 0?void 0:JSON.stringify(n),credentials:`omit`})}catch(e){throw new U(0,`Unreachable`,`the server did not answer: `+e.message)}if(a.status===204)return null;let o=await a.text(),s=null;try{s=o?JSON.parse(o):null}catch{s=null}if(!a.ok){let e=s&&s.error;throw e?new U(a.status,e.code,e.message,e.field):new U(a.status,`HTTP `+a.status,o.trim()||a.statusText)}return s}var G=encodeURIComponent,K={whoami:e=>W(`GET`,`/v1/whoami`,void 0,e),version:()=>W(`GET`,`/v1/version`),pool:()=>W(`GET`,`/v1/pool`),nodes:()=>W(`GET`,`/v1/nodes`),jobs:()=>W(`GET`,`/v1/jobs`),cancelJob:e=>W(`DELETE`,`/v1/jobs/${G(e)}`),volumes:()=>W(`GET`,`/v1/volumes`),volume:e=>W(`GET`,`/v1/volumes/${G(e)}`),createVolume:e=>W(`POST`,`/v1/volumes`,e),deleteVolume:(e,t)=>W(`DELETE`,`/v1/volumes/${G(e)}`+(t?`?recursive=true`:``)),snapshots:e=>W(`GET`,`/v1/volumes/${G(e)}/snapshots`),createSnapshot:(e,t)=>W(`POST`,`/v1/volumes/${G(e)}/snapshots`,{name:t}),deleteSnapshot:(e,t)=>W(`DELETE`,`/v1/volumes/${G(e)}/snapshots/${G(t)}`),rollback:(e,t)=>W(`POST`,`/v1/volumes/${G(e)}/rollback`,{snapshot:t}),clone:(e,t)=>W(`POST`,`/v1/clones`,{source:e,names:t}),attachments:e=>W(`GET`,`/v1/volumes/${G(e)}/attachments`),backupTargets:()=>W(`GET`,`/v1/backup-targets`),backups:(e,t)=>W(`GET`,`/v1/backups?target=${G(e)}&volume=${G(t)}`),drStatus:()=>W(`GET`,`/v1/dr/status`),stats:e=>W(`GET`,`/v1/volumes/${G(e)}/stats`),updateVolume:(e,t)=>W(`PATCH`,`/v1/volumes/${G(e)}`,t),addDisk:(e,t)=>W(`POST`,`/v1/volumes/${G(e)}/disks`,t),growDisk:(e,t,n)=>W(`PATCH`,`/v1/volumes/${G(e)}/disks/${G(t)}`,{size:n}),events:(e,t)=>W(`GET`,`/v1/events?`+(e?`after=`+e:`since=`+G(t.toISOString()))),ready:async()=>(await fetch(`/readyz`,{credentials:`omit`})).ok},Me=function(e,t,n,r){var i;t[0]=0;for(var a=1;a<t.length;a++){var o=t[a++],s=t[a]?(t[0]|=o?1:2,n[t[a++]]):t[++a];o===3?r[0]=s:o===4?r[1]=Object.assign(r[1]||{},s):o===5?(r[1]=r[1]||{})[t[++a]]=s:o===6?r[1][t[++a]]+=s+``:o?(i=e.apply(s,Me(e,s,n,[``,null])),r.push(i),s[0]?t[0]|=2:(t[a-2]=0,t[a]=i)):r.push(s)}return r},Ne=new Map;function Pe(e){var t=Ne.get(this);return t||(t=new Map,Ne.set(this,t)),(t=Me(this,t.get(e)||(t.set(e,t=function(e){for(var t,n,r=1,i=``,a=``,o=[0],s=function(e){r===1&&(e||(i=i.replace(/^\s*\n\s*|\s*\n\s*$/g,``)))?o.push(0,e,i):r===3&&(e||i)?(o.push(3,e,i),r=2):r===2&&i===`...`&&e?o.push(4,e,0):r===2&&i&&!e?o.push(5,0,!0,i):r>=5&&((i||!e&&r===5)&&(o.push(r,0,i,n),r=6),e&&(o.push(r,e,0,n),r=6)),i=``},c=0;c<e.length;c++){c&&(r===1&&s(),s(c));for(var l=0;l<e[c].length;l++)t=e[c][l],r===1?t===`<`?(s(),o=[o],r=3):i+=t:r===4?i===`--`&&t===`>`?(r=1,i=``):i=t+i[0]:a?t===a?a=``:i+=t:t===`"`||t===`'`?a=t:t===`>`?(s(),r=1):r&&(t===`=`?(r=5,n=i,i=``):t===`/`&&(r<5||e[c][l+1]===`>`)?(s(),r===3&&(o=o[0]),r=o,(o=o[0]).push(2,0,r),r=0):t===` `||t===`	`||t===`
`||t===`\r`?(s(),r=2):i+=t),r===3&&i===`!--`&&(r=4,o=o[0])}return s(),o}(e)),t),arguments,[])).length>1?t:t[0]}var q=Pe.bind(v);function J({error:e}){return e?q`<div class="error" role="alert">
    ${e.code?q`<strong>${e.code}</strong>: `:``}${e.message}
  </div>`:null}function Y({label:e,title:t,danger:n,fields:r=[],confirm:i,run:a,done:o,id:s}){let[c,l]=B(!1),[u,d]=B({}),[f,p]=B(!1),[m,h]=B(null);return q`
    <button class=${n?`danger`:``} data-action=${s} onClick=${()=>{let e={};for(let t of r)e[t.name]=t.initial??(t.type!==`checkbox`&&``);d(e),h(null),l(!0)}}>${e}</button>
    ${c&&q`<div class="backdrop">
      <form class="dialog" role="dialog" aria-label=${t} data-dialog=${s} onSubmit=${async e=>{e.preventDefault(),p(!0),h(null);try{let e=await a(u);l(!1),o&&o(e,u)}catch(e){h(e)}finally{p(!1)}}}>
        <h3>${t}</h3>
        ${r.map(e=>q`<label>
            ${e.label}
            ${e.type===`checkbox`?q`<input
                  type="checkbox"
                  name=${e.name}
                  checked=${u[e.name]}
                  onChange=${t=>d({...u,[e.name]:t.target.checked})}
                />`:e.options?q`<select
                    name=${e.name}
                    value=${u[e.name]}
                    onChange=${t=>d({...u,[e.name]:t.target.value})}
                  >
                    ${e.options.map(e=>q`<option value=${e}>${e}</option>`)}
                  </select>`:q`<input
                    name=${e.name}
                    placeholder=${e.placeholder||``}
                    value=${u[e.name]}
                    onInput=${t=>d({...u,[e.name]:t.target.value})}
                  />`}
          </label>`)}
        ${i&&q`<p class="confirm">${typeof i==`function`?i(u):i}</p>`}
        <${J} error=${m} />
        <div class="buttons">
          <button type="button" onClick=${()=>l(!1)}>Cancel</button>
          <button type="submit" class=${n?`danger`:`primary`} name="confirm" disabled=${f}>
            ${f?`Working…`:e}
          </button>
        </div>
      </form>
    </div>`}
  `}function Fe({used:e,total:t}){let n=t>0?Math.min(100,100*e/t):0;return q`<div class="meter" title=${n.toFixed(1)+`%`}>
    <div style=${{width:n+`%`}}></div>
  </div>`}var Ie=[`B`,`KiB`,`MiB`,`GiB`,`TiB`,`PiB`];function X(e){if(e==null)return``;let t=0,n=e;for(;Math.abs(n)>=1024&&t<Ie.length-1;)n/=1024,t++;return(t===0?String(n):n.toFixed(n<10?2:1))+` `+Ie[t]}var Le=0x40000000;function Re(e){let t=/^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$/i.exec(e);if(!t)return NaN;let n={"":Le,K:1024,M:1024**2,G:Le,T:1024*Le}[t[2].toUpperCase()];return Math.round(parseFloat(t[1])*n/512)*512}function Z(e){if(!e)return``;let t=new Date(e);return isNaN(t)?e:t.toISOString().replace(`T`,` `).replace(/\.\d+Z$/,`Z`)}function ze(e){return e?Object.keys(e).sort().map(t=>`${t}=${e[t]}`).join(`, `):``}function Be(e){if(!e)return``;let t=/^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(e);return t?t[1]+`.`+(t[2]||``).padEnd(9,`0`)+t[3]:e}function Ve(e,t){let n=Be(e),r=Be(t);return n<r?-1:+(n>r)}function He(){let[e,t]=B(null),[n,r]=B(null),[i,a]=B(null),[o,s]=B(null),[c,l]=B(null),[u,d]=B(null);if(V(()=>{K.pool().then(t,d),K.nodes().then(e=>r(e.items),e=>r(e)),K.ready().then(a,()=>a(!1)),K.version().then(s,()=>{}),K.jobs().then(e=>l(e.items),()=>l([]))},[]),u)return q`<${J} error=${u} />`;if(!e)return q`<p class="loading">Loading…</p>`;let f=e.totalBytes-e.freeBytes,p=e.totalBytes>0?e.provisionedBytes/e.totalBytes:0,m=(c||[]).filter(e=>e.state===`running`);return q`<section class="overview">
    <h2>Overview</h2>
    <div class="cards">
      <div class="card" data-card="health">
        <h3>Health</h3>
        <p class=${i?`ok`:`bad`}>${i===null?`…`:i?`Ready`:`Not ready`}</p>
        ${e.readOnly&&q`<p class="bad">Pool is read-only</p>`}
        ${e.broken>0&&q`<p class="bad">${e.broken} volume(s) quarantined</p>`}
        ${o&&q`<p class="dim">quiver ${o.version}</p>`}
      </div>
      <div class="card" data-card="capacity">
        <h3>Capacity</h3>
        <${Fe} used=${f} total=${e.totalBytes} />
        <p>${X(f)} used of ${X(e.totalBytes)} (${X(e.freeBytes)} free)</p>
        <p>
          ${X(e.provisionedBytes)+` provisioned: `}
          <span class=${p>1?`warn`:``}>${p.toFixed(2)}× overcommit</span>
        </p>
        <p>${e.filesystem} at ${e.path}</p>
      </div>
      <div class="card" data-card="volumes">
        <h3>Volumes</h3>
        <p class="big"><a href="#/volumes">${e.volumes}</a></p>
        ${e.tenant&&q`<p>tenant ${e.tenant.name}</p>`}
        <p>${m.length} job(s) running</p>
      </div>
    </div>
    ${e.clusterPool&&q`<p>
      Cluster ${e.cluster}: ${X(e.clusterPool.totalBytes-e.clusterPool.freeBytes)} used of
      ${X(e.clusterPool.totalBytes)}, ${e.clusterPool.volumes} volumes
    </p>`}
    <h3>Nodes</h3>
    ${n===null?q`<p class="loading">Loading…</p>`:n instanceof Error?q`<p class="dim" data-nodes="hidden">Not visible to this token (${n.code}).</p>`:q`<table class="grid">
            <thead>
              <tr><th>Name</th><th>State</th><th>Address</th><th>Capacity</th><th>Free</th><th>Volumes</th></tr>
            </thead>
            <tbody>
              ${n.map(e=>q`<tr data-node=${e.name}>
                  <td>${e.name}${e.self?` (this node)`:``}</td>
                  <td class=${e.state===`up`||e.state===`local`?`ok`:`bad`}>
                    ${e.state}${e.drain?`, `+e.drain:``}
                  </td>
                  <td>${e.address}</td>
                  <td>${X(e.capacityBytes)}</td>
                  <td>${X(e.freeBytes)}</td>
                  <td>${e.volumes}</td>
                </tr>`)}
            </tbody>
          </table>`}
  </section>`}var Ue=34,We=10,Ge=[{key:`name`,label:`Name`,value:e=>e.name},{key:`disks`,label:`Disks`,value:e=>(e.disks||[]).length},{key:`size`,label:`Size`,value:e=>Ke(e),show:e=>X(Ke(e))},{key:`capacity`,label:`Capacity`,value:e=>e.capacity||0,show:e=>X(e.capacity)},{key:`snapshots`,label:`Snapshots`,value:e=>e.snapshots||0},{key:`labels`,label:`Labels`,value:e=>ze(e.labels)},{key:`created`,label:`Created`,value:e=>Be(e.createdAt),show:e=>Z(e.createdAt)}];function Ke(e){return(e.disks||[]).reduce((e,t)=>e+t.size,0)}function qe({canWrite:e}){let[t,n]=B(null),[r,i]=B(null),[a,o]=B(``),[s,c]=B({key:`name`,dir:1}),[l,u]=B(0),[d,f]=B(600),p=be(null),m=()=>K.volumes().then(e=>n(e.items),i);V(()=>{m()},[]),V(()=>{p.current&&f(p.current.clientHeight)},[t]);let h=xe(()=>{if(!t)return[];let e=a.trim().toLowerCase(),n=Ge.find(e=>e.key===s.key);return(e?t.filter(t=>t.name.toLowerCase().includes(e)||ze(t.labels).toLowerCase().includes(e)):t.slice()).sort((e,t)=>{let r=n.value(e),i=n.value(t);return(r<i?-1:+(r>i))*s.dir})},[t,a,s]);if(r)return q`<${J} error=${r} />`;if(!t)return q`<p class="loading">Loading…</p>`;let g=Math.max(0,Math.floor(l/Ue)-We),_=Math.min(h.length,Math.ceil((l+d)/Ue)+We),v=e=>c(s.key===e?{key:e,dir:-s.dir}:{key:e,dir:1});return q`<section class="volumes">
    <div class="toolbar">
      <h2>Volumes</h2>
      <input
        type="search"
        name="search"
        placeholder="Search by name or label"
        value=${a}
        onInput=${e=>{o(e.target.value),u(0),p.current&&(p.current.scrollTop=0)}}
      />
      <span class="count" data-count=${h.length}>${h.length} of ${t.length}</span>
      ${e&&q`<${Y}
        id="create-volume"
        label="Create volume"
        title="Create a volume"
        fields=${[{name:`name`,label:`Name`,placeholder:`web01`},{name:`size`,label:`Root disk size (GiB, or 512M)`,initial:`10`},{name:`disks`,label:`Disks`,initial:`1`,options:[`1`,`2`,`3`,`4`]}]}
        confirm=${e=>`Create volume "${e.name}" with ${e.disks} disk(s) of ${e.size}?`}
        run=${e=>{let t=Re(e.size),n=parseInt(e.disks,10)||1,r=[];for(let e=0;e<n;e++)r.push({name:e===0?`root`:`data`+e,size:t});return K.createVolume({name:e.name.trim(),capacity:t*n,disks:r})}}
        done=${e=>{location.hash=`#/volumes/`+encodeURIComponent(e.name)}}
      />`}
    </div>
    <div class="vlist" role="table">
      <div class="row head" role="row">
        ${Ge.map(e=>q`<div role="columnheader" class=${`c-`+e.key} data-sort=${e.key} onClick=${()=>v(e.key)}>
            ${e.label}${s.key===e.key?s.dir>0?` ▲`:` ▼`:``}
          </div>`)}
      </div>
      <div class="body" ref=${p} onScroll=${e=>u(e.target.scrollTop)}>
        <div style=${{height:h.length*Ue+`px`,position:`relative`}}>
          ${h.slice(g,_).map((e,t)=>q`<a
              class="row"
              role="row"
              data-volume=${e.name}
              href=${`#/volumes/`+encodeURIComponent(e.name)}
              style=${{top:(g+t)*Ue+`px`}}
            >
              ${Ge.map(t=>q`<div role="cell" class=${`c-`+t.key}>${t.show?t.show(e):t.value(e)}</div>`)}
            </a>`)}
        </div>
      </div>
    </div>
  </section>`}var Je=60;function Ye({name:e,qos:t}){let[n,r]=B([]),[i,a]=B(null);V(()=>{let t=null,n=!1,i=async()=>{try{let i=await K.stats(e);if(n)return;if(a(null),t){let e=(Date.parse(i.time)-Date.parse(t.time))/1e3;if(e>0){let n={iops:(i.readOps-t.readOps+i.writeOps-t.writeOps)/e,mbps:(i.readBytes-t.readBytes+i.writeBytes-t.writeBytes)/e/1e6};r(e=>[...e.slice(-59),n])}}t=i}catch(e){n||a(e)}};i();let o=setInterval(i,1e3);return()=>{n=!0,clearInterval(o)}},[e]);let o=n[n.length-1]||{iops:0,mbps:0},s=t&&(t.rwIOPS||0),c=t&&(t.rwMBytes||0);return q`<div
    class="io"
    data-io=${e}
    data-iops=${Math.round(o.iops)}
    data-mbps=${o.mbps.toFixed(2)}
    data-samples=${n.length}
  >
    ${i&&q`<p class="dim">I/O counters: ${i.code||``} ${i.message}</p>`}
    <${Xe} label="IOPS" unit="" points=${n.map(e=>e.iops)} value=${Math.round(o.iops)} limit=${s} />
    <${Xe} label="MB/s" unit="" points=${n.map(e=>e.mbps)} value=${o.mbps.toFixed(1)} limit=${c} />
  </div>`}var Q=360,$=90;function Xe({label:e,points:t,value:n,limit:r}){let i=Math.max(1,r||0,...t)*1.1,a=e=>($-e/i*$).toFixed(1),o=e=>(Q*(e+Je-t.length)/59).toFixed(1),s=t.map((e,t)=>o(t)+`,`+a(e)).join(` `);return q`<figure class="plot">
    <figcaption>${e} <strong>${n}</strong>${r?q` <span class="dim">limit ${r}</span>`:``}</figcaption>
    <svg viewBox=${`0 0 ${Q} ${$}`} width=${Q} height=${$} role="img" aria-label=${e}>
      <rect width=${Q} height=${$} class="bg" />
      ${r?q`<line x1="0" x2=${Q} y1=${a(r)} y2=${a(r)} class="limit" />`:``}
      ${t.length>1&&q`<polyline points=${s} class="line" />`}
    </svg>
  </figure>`}var Ze=e=>q`<a href=${`#/volumes/`+encodeURIComponent(e)}>${e}</a>`;function Qe(e,t){let n=[],r=new Set([e.name]);for(let i=e.source;i&&!r.has(i.volume);){n.unshift(i),r.add(i.volume);let e=t.get(i.volume);i=e&&e.source}return n}function $e(e){let t=new Map;for(let n of e){if(!n.source)continue;let e=n.source.snapshot?n.source.volume+`@`+n.source.snapshot:n.source.volume;t.has(e)||t.set(e,[]),t.get(e).push(n)}for(let e of t.values())e.sort((e,t)=>Ve(e.createdAt,t.createdAt));return t}function et({vol:e,vols:t,snaps:n}){let r=new Map(t.map(e=>[e.name,e])),i=$e(t),a=Qe(e,r),o=new Set,s=(e,t,n)=>{o.add(e);let r=[...i.keys()].filter(t=>t.startsWith(e+`@`)).map(t=>t.slice(e.length+1)),a=t?t.map(e=>({name:e.name,at:e.createdAt})).sort((e,t)=>Ve(e.at,t.at)):[];for(let e of r)a.some(t=>t.name===e)||a.push({name:e,gone:!!t});let c=e=>(i.get(e)||[]).filter(e=>!o.has(e.name));return q`<li data-node=${`volume:`+e}>
      <span class=${t?`node self`:`node`}>${t?q`<strong>${e}</strong>`:Ze(e)}${n}</span>
      <ul>
        ${a.map(t=>q`<li data-node=${`snapshot:`+e+`@`+t.name}>
            <span class="node snap">◉ ${t.name}${t.at?q` <span class="dim">${Z(t.at)}</span>`:``}${t.gone?q` <span class="dim">(deleted)</span>`:``}</span>
            <ul>
              ${c(e+`@`+t.name).map(e=>s(e.name,null,``))}
            </ul>
          </li>`)}
        ${c(e).map(e=>s(e.name,null,q` <span class="dim">(live clone)</span>`))}
      </ul>
    </li>`};return q`<div class="lineage">
    <p data-ancestry>
      ${a.length===0?q`<span class="dim">Not a clone.</span>`:a.map(e=>q`${Ze(e.volume)}${e.snapshot?`@`+e.snapshot:` (live)`} → `)}
      ${a.length>0&&q`<strong>${e.name}</strong>`}
    </p>
    <ul class="tree" data-tree>
      ${s(e.name,n,``)}
    </ul>
  </div>`}function tt({vol:e}){let t=e.copies||[];return t.length===0?q`<p data-copies="1">One copy${e.primary?` on ${e.primary}`:`, on this node`}.</p>`:q`<table class="grid" data-table="copies" data-copies=${t.length}>
    <thead><tr><th>Node</th><th>State</th><th>Resync</th></tr></thead>
    <tbody>
      ${t.map(t=>q`<tr data-copy=${t.node} data-state=${t.state}>
          <td>${t.node}${t.node===e.primary?` (primary)`:``}</td>
          <td class=${t.state===`in-sync`?`ok`:t.state===`failed`||t.state===`degraded`?`bad`:`warn`}>
            ${t.state||`being made`}${t.reason?`: `+t.reason:``}
          </td>
          <td>
            ${t.progress!=null&&q`<div class="progress" data-progress=${t.progress}>
              <${Fe} used=${t.doneBytes} total=${t.totalBytes} />
              <span>${t.progress.toFixed(1)}% (${X(t.doneBytes)} of ${X(t.totalBytes)})</span>
            </div>`}
          </td>
        </tr>`)}
    </tbody>
  </table>`}function nt({vol:e}){let[t,n]=B(null);V(()=>{let t=!1;return(async()=>{try{let r=(await K.backupTargets()).items||[];if(r.length===0)throw new U(404,`NotFound`,`no backup target`);let i=(await Promise.all(r.map(t=>K.backups(t.name,e.name)))).flatMap(e=>e.items||[]);i.sort((e,t)=>Ve(t.createdAt,e.createdAt)),t||n({items:i})}catch(e){t||n({none:e.code===`NotFound`?`No backup target on this server.`:`${e.code}: ${e.message}`})}})(),()=>{t=!0}},[e.name]);let r=e.backupPolicy;return q`<div data-backups>
    ${r&&q`<p data-backup-policy>
      Every ${r.every}${r.target?` to ${r.target}`:``}${r.keepLast?`, keeping the last ${r.keepLast}`:``}.
    </p>`}
    ${t?t.none?q`<p class="dim">${t.none}</p>`:t.items.length===0?q`<p class="dim">No backups.</p>`:q`<table class="grid" data-table="backups">
              <thead><tr><th>ID</th><th>Target</th><th>Snapshot</th><th>Taken</th><th>Kind</th><th>Size</th><th>Stored</th></tr></thead>
              <tbody>
                ${t.items.map(e=>q`<tr data-backup=${e.id}>
                    <td>${e.id}</td><td>${e.target}</td><td>${e.snapshot}</td><td>${Z(e.createdAt)}</td>
                    <td>${e.parent?`incremental`:`full`}</td>
                    <td>${X(e.stats.logical)}</td><td>${X(e.stats.bytesSent)}</td>
                  </tr>`)}
              </tbody>
            </table>`:q`<p class="loading">Loading…</p>`}
  </div>`}function rt({vol:e}){let[t,n]=B(null);V(()=>{let t=!1;if(e.drPolicy)return K.drStatus().then(r=>!t&&n((r.items||[]).filter(t=>t.volume===e.name)),()=>!t&&n([])),()=>{t=!0}},[e.name,e.drPolicy&&e.drPolicy.relationship]);let r=e.drPolicy;return r?q`<div data-dr=${r.site+`/`+r.relationship}>
    <p>To site <strong>${r.site}</strong>, relationship <strong>${r.relationship}</strong>, RPO ${r.rpo}.</p>
    ${t&&t.length>0&&q`<table class="grid" data-table="dr">
      <thead><tr><th>Site</th><th>Last point</th><th>Taken</th><th>Lag</th><th>Cycles</th><th>Failures</th><th>Last error</th></tr></thead>
      <tbody>
        ${t.map(e=>q`<tr data-dr-status=${e.site+`/`+e.relationship} data-last-point=${e.lastPoint||``}>
            <td>${e.site}</td>
            <td>${e.lastPoint||`—`}</td>
            <td>${Z(e.lastPointAt)}</td>
            <td class=${e.missed?`bad`:`ok`}>${(e.lagNs/1e9).toFixed(1)} s${e.missed?` (RPO missed)`:``}</td>
            <td>${e.cycles}</td>
            <td>${e.failures}</td>
            <td class="bad">${e.lastError||``}</td>
          </tr>`)}
      </tbody>
    </table>`}
  </div>`:q`<p class="dim" data-dr="none">No DR relationship.</p>`}var it=[[`rwIOPS`,`IOPS, reads and writes`],[`rwMBytes`,`MB/s, reads and writes`],[`readIOPS`,`Read IOPS`],[`writeIOPS`,`Write IOPS`],[`readMBytes`,`Read MB/s`],[`writeMBytes`,`Write MB/s`]];function at({name:e,canWrite:t}){let[n,r]=B(null),[i,a]=B([]),[o,s]=B([]),[c,l]=B(null),[u,d]=B(null),[f,p]=B(``),m=()=>{K.volume(e).then(r,d),K.snapshots(e).then(e=>a(e.items||[]),()=>a([])),K.attachments(e).then(e=>s(e.items||[]),()=>s([])),K.volumes().then(e=>l(e.items||[]),()=>l([]))};V(m,[e]),V(()=>{let t=!1,n=setInterval(()=>{K.attachments(e).then(e=>!t&&s(e.items||[]),()=>{}),K.volume(e).then(e=>!t&&r(e),()=>{})},2e3);return()=>{t=!0,clearInterval(n)}},[e]);let h=e=>()=>{p(e),m()};if(u)return q`<p><a href="#/volumes">← Volumes</a></p><${J} error=${u} />`;if(!n)return q`<p class="loading">Loading…</p>`;if(n.state===`broken`)return q`<section><h2>${n.name}</h2><div class="error" role="alert">Quarantined: ${n.reason}</div></section>`;let g=o.find(e=>e.writer),_=o.filter(e=>e.fenced);return q`<section class="volume" data-volume-page=${n.name}>
    <p><a href="#/volumes">← Volumes</a></p>
    <div class="toolbar">
      <h2>${n.name}</h2>
      ${t&&q`<div class="actions">
        <${Y}
          id="snapshot"
          label="Snapshot"
          title=${`Snapshot every disk of `+n.name}
          fields=${[{name:`name`,label:`Snapshot name`,placeholder:`nightly`}]}
          confirm="One crash-consistent snapshot of all the volume's disks at one instant."
          run=${e=>K.createSnapshot(n.name,e.name.trim())}
          done=${e=>h(`Snapshot ${e.name} taken.`)()}
        />
        <${Y}
          id="clone"
          label="Clone"
          title=${`Clone `+n.name+` (live)`}
          fields=${[{name:`names`,label:`New volume name(s), comma-separated`,placeholder:`web02`}]}
          confirm="Clones the live volume through an implicit snapshot."
          run=${e=>K.clone({volume:n.name},ot(e.names))}
          done=${e=>h(`Cloned to ${e.items.map(e=>e.name).join(`, `)}.`)()}
        />
        <${Y}
          id="qos"
          label="QoS"
          title=${`QoS limits of `+n.name}
          fields=${it.map(([e,t])=>({name:e,label:t,placeholder:`unlimited`,initial:String((n.qos||{})[e]||``)}))}
          confirm="One budget for all the volume's disks; an empty field is unlimited. Applies at once to the running VM."
          run=${e=>K.updateVolume(n.name,{qos:ct(e)})}
          done=${h(`QoS limits changed.`)}
        />
        <${Y}
          id="labels"
          label="Labels"
          title=${`Labels of `+n.name}
          fields=${[{name:`labels`,label:`Labels (key=value, comma-separated)`,initial:ze(n.labels)}]}
          confirm="Replaces all the volume's labels."
          run=${e=>K.updateVolume(n.name,{labels:lt(e.labels)})}
          done=${h(`Labels changed.`)}
        />
        <${Y}
          id="add-disk"
          label="Add disk"
          title=${`Add a disk to `+n.name}
          fields=${[{name:`name`,label:`Disk name`,placeholder:`data2`},{name:`size`,label:`Size (GiB, or 512M, 2T)`,initial:`1`},{name:`shared`,label:`Shared (several writers at once)`,type:`checkbox`}]}
          run=${e=>K.addDisk(n.name,{name:e.name.trim(),size:Re(e.size),shared:e.shared})}
          done=${(e,t)=>h(`Disk ${t.name.trim()} added.`)()}
        />
        <${Y}
          id="delete-volume"
          danger
          label="Delete"
          title=${`Delete `+n.name}
          fields=${[{name:`recursive`,label:`Delete its snapshots too`,type:`checkbox`,initial:n.snapshots>0}]}
          confirm=${`Delete volume "${n.name}" and all its disks? This cannot be undone.`}
          run=${e=>K.deleteVolume(n.name,e.recursive)}
          done=${()=>{location.hash=`#/volumes`}}
        />
      </div>`}
    </div>
    ${f&&q`<div class="notice" role="status">${f}</div>`}
    <dl class="facts">
      <dt>Capacity</dt><dd>${X(n.capacity)}</dd>
      <dt>Created</dt><dd>${Z(n.createdAt)}</dd>
      ${n.tenant&&q`<dt>Tenant</dt><dd>${n.tenant}</dd>`}
      <dt>Labels</dt><dd>${ze(n.labels)||`—`}</dd>
      ${n.encryption&&q`<dt>Encryption</dt>
        <dd data-encryption>${ut(n.encryption)}</dd>`}
      ${n.source&&q`<dt>Cloned from</dt>
        <dd data-source>
          <a href=${`#/volumes/`+encodeURIComponent(n.source.volume)}>${n.source.volume}</a>
          ${n.source.snapshot?`@`+n.source.snapshot:` (live)`}
        </dd>`}
      <dt>Writer</dt>
      <dd data-writer=${g?g.id:``}>
        ${g?`${g.node} (attachment ${g.id}, epoch ${n.writer&&n.writer.epoch})`:`none connected`}
      </dd>
      <dt>Fenced</dt>
      <dd data-fenced=${_.map(e=>e.id).join(` `)} class=${_.length?`bad`:``}>
        ${_.length?_.map(e=>`${e.node} (attachment ${e.id})`).join(`, `):`none`}
      </dd>
      ${n.qos&&q`<dt>QoS</dt><dd>${st(n.qos)}</dd>`}
    </dl>

    <h3>Disks</h3>
    <table class="grid" data-table="disks">
      <thead><tr><th>Name</th><th>Size</th><th>Allocated</th><th>Shared</th>${t&&q`<th></th>`}</tr></thead>
      <tbody>
        ${(n.disks||[]).map(e=>q`<tr data-disk=${e.name}>
            <td>${e.name}</td><td data-size=${e.size}>${X(e.size)}</td><td>${X(e.allocated)}</td><td>${e.shared?`yes`:``}</td>
            ${t&&q`<td class="actions">
              <${Y}
                id=${`grow-`+e.name}
                label="Grow"
                title=${`Grow disk ${e.name} of ${n.name}`}
                fields=${[{name:`size`,label:`New size (GiB, or 512M, 2T)`,initial:String(e.size/2**30)}]}
                confirm="A disk only grows; the VM sees the new size at its next size check."
                run=${t=>K.growDisk(n.name,e.name,Re(t.size))}
                done=${(t,n)=>h(`Disk ${e.name} grown to ${X(Re(n.size))}.`)()}
              />
            </td>`}
          </tr>`)}
      </tbody>
    </table>

    <h3>I/O</h3>
    <${Ye} name=${n.name} qos=${n.qos} />

    <h3>Snapshots</h3>
    ${i.length===0?q`<p class="dim">No snapshots.</p>`:q`<table class="grid" data-table="snapshots">
          <thead><tr><th>Name</th><th>Taken</th><th>Method</th><th>Disks</th>${t&&q`<th></th>`}</tr></thead>
          <tbody>
            ${i.map(e=>q`<tr data-snapshot=${e.name}>
                <td>${e.name}</td>
                <td>${Z(e.createdAt)}</td>
                <td>${e.method}</td>
                <td>${(e.disks||[]).map(e=>e.name).join(`, `)}</td>
                ${t&&q`<td class="actions">
                  <${Y}
                    id=${`clone-snapshot-`+e.name}
                    label="Clone"
                    title=${`Clone ${n.name}@${e.name}`}
                    fields=${[{name:`names`,label:`New volume name(s), comma-separated`}]}
                    run=${t=>K.clone({volume:n.name,snapshot:e.name},ot(t.names))}
                    done=${e=>h(`Cloned to ${e.items.map(e=>e.name).join(`, `)}.`)()}
                  />
                  <${Y}
                    id=${`rollback-`+e.name}
                    danger
                    label="Rollback"
                    title=${`Roll ${n.name} back to ${e.name}`}
                    confirm=${`Every disk of ${n.name} returns to snapshot ${e.name}; later writes are lost. The server refuses while a writer is connected.`}
                    run=${()=>K.rollback(n.name,e.name)}
                    done=${h(`Rolled back to ${e.name}.`)}
                  />
                  <${Y}
                    id=${`delete-snapshot-`+e.name}
                    danger
                    label="Delete"
                    title=${`Delete snapshot ${e.name}`}
                    confirm=${`Delete snapshot ${n.name}@${e.name}?`}
                    run=${()=>K.deleteSnapshot(n.name,e.name)}
                    done=${h(`Snapshot ${e.name} deleted.`)}
                  />
                </td>`}
              </tr>`)}
          </tbody>
        </table>`}

    <h3>Lineage</h3>
    ${c?q`<${et} vol=${n} vols=${c} snaps=${i} />`:q`<p class="loading">Loading…</p>`}

    <h3>Attachments</h3>
    ${o.length===0?q`<p class="dim">Not attached.</p>`:q`<table class="grid" data-table="attachments">
          <thead><tr><th>ID</th><th>Node</th><th>Mode</th><th>State</th><th>Connections</th><th>Since</th></tr></thead>
          <tbody>
            ${o.map(e=>q`<tr data-attachment=${e.id} data-state=${e.state}>
                <td>${e.id}</td>
                <td>${e.node}${e.implicit?` (implicit)`:``}</td>
                <td>${e.mode}</td>
                <td class=${e.state===`fenced`?`bad`:e.state===`writer`?`ok`:``}>${e.state}</td>
                <td>${e.connections}</td>
                <td>${Z(e.createdAt)}</td>
              </tr>`)}
          </tbody>
        </table>`}

    <h3>Copies</h3>
    <${tt} vol=${n} />

    <h3>Backups</h3>
    <${nt} vol=${n} />

    <h3>DR</h3>
    <${rt} vol=${n} />
  </section>`}function ot(e){return e.split(/[\s,]+/).map(e=>e.trim()).filter(Boolean)}function st(e){return Object.entries(e).map(([e,t])=>`${e} ${t}`).join(`, `)}function ct(e){let t={};for(let[n,r]of it){let i=(e[n]||``).trim();if(i!==``&&i!==`0`){if(!/^\d+$/.test(i))throw new U(0,`Invalid`,`${r}: "${i}" is not a whole number`,n);t[n]=Number(i)}}return t}function lt(e){let t={};for(let n of e.split(`,`).map(e=>e.trim()).filter(Boolean)){let e=n.indexOf(`=`);if(e<0)throw new U(0,`Invalid`,`label "${n}": want key=value`,`labels`);t[n.slice(0,e).trim()]=n.slice(e+1).trim()}return t}function ut(e){let t=`XTS-AES-256, data key wrapped by KEK ${e.keyId} of ${e.provider}`,n=e.rekey;if(n){let e=n.totalBytes>0?Math.floor(100*n.doneBytes/n.totalBytes):0;t+=`; deep rekey ${e}% (${X(n.doneBytes)} of ${X(n.totalBytes)}), ${n.running?`running`:`interrupted: run quiver volume rekey --deep to finish it`}`}return t}function dt({canWrite:e}){let[t,n]=B(null),[r,i]=B(null),[a,o]=B(``);if(V(()=>{let e=!1,t=()=>K.jobs().then(t=>!e&&(n(t.items||[]),i(null)),t=>!e&&i(t));t();let r=setInterval(t,1e3);return()=>{e=!0,clearInterval(r)}},[]),!t)return r?q`<${J} error=${r} />`:q`<p class="loading">Loading…</p>`;let s=[...t].sort((e,t)=>Ve(t.startedAt,e.startedAt));return q`<section class="jobs">
    <div class="toolbar"><h2>Jobs</h2><span class="count">${t.length} job(s), finished ones kept 10 minutes</span></div>
    <${J} error=${r} />
    ${a&&q`<div class="notice" role="status">${a}</div>`}
    ${s.length===0?q`<p class="dim">No jobs.</p>`:q`<table class="grid" data-table="jobs">
          <thead><tr><th>Kind</th><th>Target</th><th>State</th><th>Progress</th><th>Started</th><th>Ended</th>${e&&q`<th></th>`}</tr></thead>
          <tbody>
            ${s.map(t=>{let n=t.itemsTotal>0,r=n?t.itemsDone:t.bytesDone,i=n?t.itemsTotal:t.bytesTotal;return q`<tr data-job=${t.id} data-state=${t.state} data-done=${r} data-total=${i}>
                <td>${t.kind}</td>
                <td>${t.target}</td>
                <td class=${t.state===`failed`?`bad`:t.state===`done`?`ok`:``}>
                  ${t.state}${t.error?q`: <span class="bad">${t.error.code}: ${t.error.message}</span>`:``}
                </td>
                <td>
                  <div class="progress">
                    <${Fe} used=${r} total=${i} />
                    <span>${n?`${r}/${i}`:i>0?`${X(r)} of ${X(i)}`:``}</span>
                  </div>
                </td>
                <td>${Z(t.startedAt)}</td>
                <td>${Z(t.endedAt)}</td>
                ${e&&q`<td class="actions">
                  ${t.state===`running`&&q`<${Y}
                    id=${`cancel-job-`+t.id}
                    danger
                    label="Cancel job"
                    title=${`Cancel ${t.kind} ${t.target}`}
                    confirm="The job stops and undoes its partial work; it ends as cancelled."
                    run=${()=>K.cancelJob(t.id)}
                    done=${()=>o(`Cancelling job ${t.id}.`)}
                  />`}
                </td>`}
              </tr>`})}
          </tbody>
        </table>`}
  </section>`}var ft=500;function pt(){let[e,t]=B(null),[n,r]=B(null);return V(()=>{let e=!1,n=0,i=new Date(Date.now()-864e5),a=async()=>{try{let a=await K.events(n,i);if(e)return;let o=a.items||[];o.length&&(n=o[o.length-1].seq),t(e=>[...o.reverse(),...e||[]].slice(0,ft)),r(null)}catch(t){e||r(t)}};a();let o=setInterval(a,2e3);return()=>{e=!0,clearInterval(o)}},[]),e?q`<section>
    <div class="toolbar"><h2>Audit log</h2><span class="count">the last day's changes and refusals, newest first</span></div>
    <${J} error=${n} />
    ${e.length===0?q`<p class="dim">No events.</p>`:q`<table class="grid events" data-table="events">
          <thead><tr><th>#</th><th>Time</th><th>Who</th><th>Request</th><th>Names</th><th>Answer</th></tr></thead>
          <tbody>
            ${e.map(e=>q`<tr data-event=${e.seq} data-route=${e.route||``} data-status=${e.status} data-tenant=${e.who.tenant||``}>
                <td>${e.seq}</td>
                <td>${Z(e.time)}</td>
                <td>${[e.who.role,e.who.tenant,e.who.tokenId,e.who.cert,e.who.remote].filter(Boolean).join(` · `)}</td>
                <td>${e.route||e.method}</td>
                <td>${Object.entries(e.names||{}).map(([e,t])=>`${e}=${t}`).join(` `)}</td>
                <td class=${e.status>=400?`bad`:`ok`}>${e.status}${e.code?` `+e.code:``}</td>
              </tr>`)}
          </tbody>
        </table>`}
  </section>`:n?q`<${J} error=${n} />`:q`<p class="loading">Loading…</p>`}var mt=new Set([`admin`,`tenant`]);function ht(){let[e,t]=B(location.hash);return V(()=>{let e=()=>t(location.hash);return addEventListener(`hashchange`,e),()=>removeEventListener(`hashchange`,e)},[]),e}function gt({onLogin:e,error:t}){let[n,r]=B(``),[i,a]=B(t),[o,s]=B(!1);return q`<form class="login" onSubmit=${async t=>{t.preventDefault(),s(!0),a(null);try{let t=await K.whoami(n.trim());je(n.trim()),e(t)}catch(e){a(e)}finally{s(!1)}}}>
    <h1>quiver</h1>
    <label>
      API token
      <input type="password" name="token" autocomplete="off" value=${n} onInput=${e=>r(e.target.value)} />
    </label>
    <p class="dim">The token stays in this tab (sessionStorage) and goes only to this server's API.</p>
    <${J} error=${i} />
    <button class="primary" type="submit" disabled=${o}>Sign in</button>
  </form>`}function _t(){let e=ht(),[t,n]=B(void 0);if(V(()=>{let e=Ae();e===null?n(null):K.whoami(e).then(n,()=>{je(null),n(null)})},[]),t===void 0)return q`<p class="loading">Loading…</p>`;if(t===null)return q`<${gt} onLogin=${n} />`;let r=mt.has(t.role),i=()=>{je(null),n(null),location.hash=``},a,o=/^#\/volumes\/(.+)$/.exec(e);a=o?q`<${at} key=${o[1]} name=${decodeURIComponent(o[1])} canWrite=${r} />`:e===`#/volumes`?q`<${qe} canWrite=${r} />`:e===`#/jobs`?q`<${dt} canWrite=${r} />`:e===`#/events`?q`<${pt} />`:q`<${He} />`;let s=(e,t,n)=>q`<a href=${e} class=${n?`on`:``}>${t}</a>`;return q`<div class="app">
    <header>
      <span class="brand">quiver</span>
      <nav>
        ${s(`#/`,`Overview`,!/^#\/(volumes|jobs|events)/.test(e))}
        ${s(`#/volumes`,`Volumes`,e.startsWith(`#/volumes`))} ${s(`#/jobs`,`Jobs`,e===`#/jobs`)}
        ${s(`#/events`,`Audit log`,e===`#/events`)}
      </nav>
      <span class="me" data-role=${t.role}>
        ${t.role}${t.tenant?` of `+t.tenant:``}${t.tokenID?` · `+t.tokenID:``}
      </span>
      <button onClick=${i}>Sign out</button>
    </header>
    <main>${a}</main>
  </div>`}I(q`<${_t} />`,document.getElementById(`app`));